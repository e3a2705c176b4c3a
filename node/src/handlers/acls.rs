//! ACLs (CreateAcls, DescribeAcls, DeleteAcls) and SCRAM credentials
//! (AlterUserScramCredentials, DescribeUserScramCredentials): changes go to
//! the active controller (`skiff_controller::access` decides, with Kafka's
//! checks) and are answered once this node has applied them; descriptions
//! are read from the core's own copy (`TopicTable::security`).
//!
//! Who may call these is issue 17's authorization (ALTER / DESCRIBE on the
//! cluster); until that lands every connection may.

use std::collections::BTreeMap;

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, CreateAclsRequest,
    CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse, DescribeAclsRequest,
    DescribeAclsResponse, DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
};
use kafka_protocol::ResponseError;
use skiff_controller::access::{self, AclFilterRecord, ScramAlteration};
use skiff_controller::records::AclRecord;

use crate::kafka::str_bytes;
use crate::state::CoreState;
use crate::topics;

/// The refusal every entry gets when the controller could not be asked.
pub(super) fn unanswered(e: &topics::TopicError) -> (i16, String) {
    match e {
        topics::TopicError::Refused { code, message } => (*code, message.clone()),
        _ => (ResponseError::RequestTimedOut.code(), e.to_string()),
    }
}

pub async fn create_acls(core: &CoreState, request: CreateAclsRequest) -> CreateAclsResponse {
    let bindings: Vec<AclRecord> = request
        .creations
        .into_iter()
        .map(|c| AclRecord {
            resource_type: c.resource_type,
            resource_name: c.resource_name.to_string(),
            pattern_type: c.resource_pattern_type,
            principal: c.principal.to_string(),
            host: c.host.to_string(),
            operation: c.operation,
            permission: c.permission_type,
        })
        .collect();
    let count = bindings.len();
    let refusals = match topics::create_acls(core, bindings).await {
        Ok(r) => r,
        Err(e) => vec![Some(unanswered(&e)); count],
    };
    CreateAclsResponse::default().with_results(
        refusals
            .into_iter()
            .map(|r| match r {
                None => AclCreationResult::default(),
                Some((code, message)) => AclCreationResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(message))),
            })
            .collect(),
    )
}

pub fn describe_acls(core: &CoreState, request: DescribeAclsRequest) -> DescribeAclsResponse {
    let filter = AclFilterRecord {
        resource_type: request.resource_type_filter,
        resource_name: request.resource_name_filter.map(|s| s.to_string()),
        pattern_type: request.pattern_type_filter,
        principal: request.principal_filter.map(|s| s.to_string()),
        host: request.host_filter.map(|s| s.to_string()),
        operation: request.operation,
        permission: request.permission_type,
    };
    let filter = match filter.filter() {
        Ok(f) => f,
        Err(e) => {
            return DescribeAclsResponse::default()
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(Some(str_bytes(e.to_string())))
        }
    };
    let table = core.topics();
    // Grouped by resource pattern, as Kafka answers.
    let mut resources: BTreeMap<(i8, String, i8), Vec<AclDescription>> = BTreeMap::new();
    for b in table.security.acls.iter().filter(|b| filter.matches(b)) {
        let r = access::acl_record(b);
        resources
            .entry((r.resource_type, r.resource_name, r.pattern_type))
            .or_default()
            .push(
                AclDescription::default()
                    .with_principal(str_bytes(r.principal))
                    .with_host(str_bytes(r.host))
                    .with_operation(r.operation)
                    .with_permission_type(r.permission),
            );
    }
    DescribeAclsResponse::default().with_resources(
        resources
            .into_iter()
            .map(|((resource_type, name, pattern_type), acls)| {
                DescribeAclsResource::default()
                    .with_resource_type(resource_type)
                    .with_resource_name(str_bytes(name))
                    .with_pattern_type(pattern_type)
                    .with_acls(acls)
            })
            .collect(),
    )
}

pub async fn delete_acls(core: &CoreState, request: DeleteAclsRequest) -> DeleteAclsResponse {
    let filters: Vec<AclFilterRecord> = request
        .filters
        .into_iter()
        .map(|f| AclFilterRecord {
            resource_type: f.resource_type_filter,
            resource_name: f.resource_name_filter.map(|s| s.to_string()),
            pattern_type: f.pattern_type_filter,
            principal: f.principal_filter.map(|s| s.to_string()),
            host: f.host_filter.map(|s| s.to_string()),
            operation: f.operation,
            permission: f.permission_type,
        })
        .collect();
    let count = filters.len();
    let results = match topics::delete_acls(core, filters).await {
        Ok(r) => r,
        Err(e) => vec![Err(unanswered(&e)); count],
    };
    DeleteAclsResponse::default().with_filter_results(
        results
            .into_iter()
            .map(|r| match r {
                Ok(removed) => DeleteAclsFilterResult::default().with_matching_acls(
                    removed
                        .into_iter()
                        .map(|a| {
                            DeleteAclsMatchingAcl::default()
                                .with_resource_type(a.resource_type)
                                .with_resource_name(str_bytes(a.resource_name))
                                .with_pattern_type(a.pattern_type)
                                .with_principal(str_bytes(a.principal))
                                .with_host(str_bytes(a.host))
                                .with_operation(a.operation)
                                .with_permission_type(a.permission)
                        })
                        .collect(),
                ),
                Err((code, message)) => DeleteAclsFilterResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(message))),
            })
            .collect(),
    )
}

/// Kafka's answer for each named user (every user with a credential when
/// none is named): mechanisms and iterations, never salts or keys.
pub fn describe_user_scram_credentials(
    core: &CoreState,
    request: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let table = core.topics();
    let security = &table.security;
    let named: Vec<String> = request
        .users
        .unwrap_or_default()
        .into_iter()
        .map(|u| u.name.to_string())
        .collect();
    let users: Vec<String> = if named.is_empty() {
        security.credentials.keys().cloned().collect()
    } else {
        named.clone()
    };
    let results = users
        .iter()
        .map(|user| {
            let result = DescribeUserScramCredentialsResult::default().with_user(str_bytes(user));
            if named.iter().filter(|n| *n == user).count() > 1 {
                return result
                    .with_error_code(ResponseError::DuplicateResource.code())
                    .with_error_message(Some(str_bytes(
                        "Cannot describe SCRAM credentials for the same user twice in a single request",
                    )));
            }
            match security.credentials.get(user) {
                Some(creds) => result.with_credential_infos(
                    creds
                        .iter()
                        .map(|c| {
                            CredentialInfo::default()
                                .with_mechanism(c.mechanism.kafka_type())
                                .with_iterations(c.iterations as i32)
                        })
                        .collect(),
                ),
                None => result
                    .with_error_code(ResponseError::ResourceNotFound.code())
                    .with_error_message(Some(str_bytes(
                        "Attempt to describe a user credential that does not exist",
                    ))),
            }
        })
        .collect();
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

pub async fn alter_user_scram_credentials(
    core: &CoreState,
    request: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let alterations: Vec<ScramAlteration> = request
        .deletions
        .into_iter()
        .map(|d| ScramAlteration::Delete {
            name: d.name.to_string(),
            mechanism: d.mechanism,
        })
        .chain(
            request
                .upsertions
                .into_iter()
                .map(|u| ScramAlteration::Upsert {
                    name: u.name.to_string(),
                    mechanism: u.mechanism,
                    iterations: u.iterations,
                    salt: u.salt.to_vec(),
                    salted_password: u.salted_password.to_vec(),
                }),
        )
        .collect();
    // The controller answers per user, in the order first named.
    let mut users: Vec<String> = Vec::new();
    for a in &alterations {
        if !users.iter().any(|u| u == a.name()) {
            users.push(a.name().to_string());
        }
    }
    let refusals = match topics::alter_scram_credentials(core, alterations).await {
        Ok(r) => r,
        Err(e) => vec![Some(unanswered(&e)); users.len()],
    };
    AlterUserScramCredentialsResponse::default().with_results(
        users
            .into_iter()
            .zip(refusals)
            .map(|(user, r)| {
                let result = AlterUserScramCredentialsResult::default().with_user(str_bytes(user));
                match r {
                    None => result,
                    Some((code, message)) => result
                        .with_error_code(code)
                        .with_error_message(Some(str_bytes(message))),
                }
            })
            .collect(),
    )
}

/// CreateAcls without ALTER on the cluster: every creation refused.
pub fn create_acls_refused(request: &CreateAclsRequest) -> CreateAclsResponse {
    CreateAclsResponse::default().with_results(
        request
            .creations
            .iter()
            .map(|_| {
                AclCreationResult::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
            })
            .collect(),
    )
}

/// DeleteAcls without ALTER on the cluster: every filter refused.
pub fn delete_acls_refused(request: &DeleteAclsRequest) -> DeleteAclsResponse {
    DeleteAclsResponse::default().with_filter_results(
        request
            .filters
            .iter()
            .map(|_| {
                DeleteAclsFilterResult::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
            })
            .collect(),
    )
}

/// AlterUserScramCredentials without ALTER on the cluster: every user refused.
pub fn alter_user_scram_credentials_refused(
    request: &AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let mut users: Vec<String> = Vec::new();
    let named = request
        .deletions
        .iter()
        .map(|d| d.name.to_string())
        .chain(request.upsertions.iter().map(|u| u.name.to_string()));
    for n in named {
        if !users.contains(&n) {
            users.push(n);
        }
    }
    AlterUserScramCredentialsResponse::default().with_results(
        users
            .into_iter()
            .map(|u| {
                AlterUserScramCredentialsResult::default()
                    .with_user(str_bytes(u))
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
            })
            .collect(),
    )
}
