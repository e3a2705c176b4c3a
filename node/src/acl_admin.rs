//! `skiff acl add | list | remove`: Kafka's ACL admin APIs (CreateAcls,
//! DescribeAcls, DeleteAcls) over the Kafka port, as `kafka-acls.sh` uses them;
//! and `skiff user list` (DescribeUserScramCredentials).

use anyhow::{bail, Context};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;
use skiff_security::{
    AccessControlEntry, AclBinding, AclBindingFilter, AclOperation, AclPermission, PatternType,
    ResourcePattern, ResourceType,
};

use crate::admin_client::AdminClient;

/// CreateAcls, DescribeAcls, DeleteAcls at v1 (pattern types; not flexible).
const VERSION: i16 = 1;

/// What the command line names: one resource (or none, for list), and the
/// entry's parts.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub topic: Option<String>,
    pub group: Option<String>,
    pub transactional_id: Option<String>,
    pub cluster: bool,
    pub prefixed: bool,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operations: Vec<String>,
    pub deny: bool,
}

impl Selection {
    fn resource(&self) -> Option<(ResourceType, String)> {
        if let Some(t) = &self.topic {
            return Some((ResourceType::Topic, t.clone()));
        }
        if let Some(g) = &self.group {
            return Some((ResourceType::Group, g.clone()));
        }
        if let Some(t) = &self.transactional_id {
            return Some((ResourceType::TransactionalId, t.clone()));
        }
        self.cluster.then(|| {
            (
                ResourceType::Cluster,
                skiff_security::acl::CLUSTER_NAME.to_string(),
            )
        })
    }

    fn operations(&self) -> anyhow::Result<Vec<AclOperation>> {
        self.operations
            .iter()
            .map(|o| {
                AclOperation::parse(o)
                    .filter(|o| *o != AclOperation::Any)
                    .with_context(|| format!("operation {o:?} (READ, WRITE, DESCRIBE, ALL, ...)"))
            })
            .collect()
    }

    fn pattern_type(&self) -> PatternType {
        if self.prefixed {
            PatternType::Prefixed
        } else {
            PatternType::Literal
        }
    }

    fn permission(&self) -> AclPermission {
        if self.deny {
            AclPermission::Deny
        } else {
            AclPermission::Allow
        }
    }

    /// The bindings `add` creates: one per operation.
    pub fn bindings(&self) -> anyhow::Result<Vec<AclBinding>> {
        let Some((resource_type, name)) = self.resource() else {
            bail!("name a resource: --topic, --group, --transactional-id or --cluster");
        };
        let Some(principal) = self.principal.clone() else {
            bail!("--principal is needed (User:NAME, or User:* for everyone)");
        };
        let operations = self.operations()?;
        if operations.is_empty() {
            bail!("name at least one --operation");
        }
        let bindings: Vec<AclBinding> = operations
            .into_iter()
            .map(|operation| AclBinding {
                pattern: ResourcePattern {
                    resource_type,
                    name: name.clone(),
                    pattern_type: self.pattern_type(),
                },
                entry: AccessControlEntry {
                    principal: principal.clone(),
                    host: self.host.clone().unwrap_or_else(|| "*".into()),
                    operation,
                    permission: self.permission(),
                },
            })
            .collect();
        for b in &bindings {
            b.validate()?;
        }
        Ok(bindings)
    }

    /// The filters `list` and `remove` match with (nothing named: everything).
    pub fn filters(&self, exact: bool) -> anyhow::Result<Vec<AclBindingFilter>> {
        let (resource_type, name) = match self.resource() {
            Some((t, n)) => (t, Some(n)),
            None => (ResourceType::Any, None),
        };
        let pattern_type = match (name.is_some(), exact) {
            (false, _) => PatternType::Any,
            (true, true) => self.pattern_type(),
            // Listing a named resource shows every pattern that covers it.
            (true, false) => PatternType::Match,
        };
        let base = AclBindingFilter {
            resource_type,
            name,
            pattern_type,
            principal: self.principal.clone(),
            host: self.host.clone(),
            operation: AclOperation::Any,
            permission: if exact {
                self.permission()
            } else {
                AclPermission::Any
            },
        };
        let operations = self.operations()?;
        if operations.is_empty() {
            return Ok(vec![base]);
        }
        Ok(operations
            .into_iter()
            .map(|operation| AclBindingFilter {
                operation,
                ..base.clone()
            })
            .collect())
    }
}

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

pub fn add(bootstrap: &str, selection: &Selection) -> anyhow::Result<Vec<AclBinding>> {
    let bindings = selection.bindings()?;
    let request = CreateAclsRequest::default().with_creations(
        bindings
            .iter()
            .map(|b| {
                AclCreation::default()
                    .with_resource_type(b.pattern.resource_type.code())
                    .with_resource_name(s(&b.pattern.name))
                    .with_resource_pattern_type(b.pattern.pattern_type.code())
                    .with_principal(s(&b.entry.principal))
                    .with_host(s(&b.entry.host))
                    .with_operation(b.entry.operation.code())
                    .with_permission_type(b.entry.permission.code())
            })
            .collect(),
    );
    let response: CreateAclsResponse = AdminClient::connect(bootstrap)?.call(&request, VERSION)?;
    for r in &response.results {
        refused("CreateAcls", r.error_code, r.error_message.as_deref())?;
    }
    Ok(bindings)
}

fn describe_one(client: &mut AdminClient, f: &AclBindingFilter) -> anyhow::Result<Vec<AclBinding>> {
    let request = DescribeAclsRequest::default()
        .with_resource_type_filter(f.resource_type.code())
        .with_resource_name_filter(f.name.as_deref().map(s))
        .with_pattern_type_filter(f.pattern_type.code())
        .with_principal_filter(f.principal.as_deref().map(s))
        .with_host_filter(f.host.as_deref().map(s))
        .with_operation(f.operation.code())
        .with_permission_type(f.permission.code());
    let response: DescribeAclsResponse = client.call(&request, VERSION)?;
    refused(
        "DescribeAcls",
        response.error_code,
        response.error_message.as_deref(),
    )?;
    let mut out = Vec::new();
    for r in response.resources {
        for a in r.acls {
            let code = |what: &str, c: i8| anyhow::anyhow!("the server answered {what} code {c}");
            out.push(AclBinding {
                pattern: ResourcePattern {
                    resource_type: ResourceType::from_code(r.resource_type)
                        .ok_or_else(|| code("resource type", r.resource_type))?,
                    name: r.resource_name.to_string(),
                    pattern_type: PatternType::from_code(r.pattern_type)
                        .ok_or_else(|| code("pattern type", r.pattern_type))?,
                },
                entry: AccessControlEntry {
                    principal: a.principal.to_string(),
                    host: a.host.to_string(),
                    operation: AclOperation::from_code(a.operation)
                        .ok_or_else(|| code("operation", a.operation))?,
                    permission: AclPermission::from_code(a.permission_type)
                        .ok_or_else(|| code("permission", a.permission_type))?,
                },
            });
        }
    }
    Ok(out)
}

pub fn list(bootstrap: &str, selection: &Selection) -> anyhow::Result<Vec<AclBinding>> {
    let mut client = AdminClient::connect(bootstrap)?;
    let mut out = Vec::new();
    for f in selection.filters(false)? {
        out.extend(describe_one(&mut client, &f)?);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Removes the bindings the selection names exactly; returns them.
pub fn remove(bootstrap: &str, selection: &Selection) -> anyhow::Result<Vec<AclBinding>> {
    if selection.resource().is_none() && selection.principal.is_none() {
        bail!("name a resource or a --principal (removing every ACL needs both left out on purpose: use --all)");
    }
    remove_filters(bootstrap, selection.filters(true)?)
}

pub fn remove_all(bootstrap: &str) -> anyhow::Result<Vec<AclBinding>> {
    remove_filters(bootstrap, vec![AclBindingFilter::any()])
}

fn remove_filters(
    bootstrap: &str,
    filters: Vec<AclBindingFilter>,
) -> anyhow::Result<Vec<AclBinding>> {
    let mut client = AdminClient::connect(bootstrap)?;
    // What will go, for the answer (DeleteAcls v1 answers it too, as codes).
    let mut gone = Vec::new();
    for f in &filters {
        gone.extend(describe_one(&mut client, f)?);
    }
    let request = DeleteAclsRequest::default().with_filters(
        filters
            .iter()
            .map(|f| {
                DeleteAclsFilter::default()
                    .with_resource_type_filter(f.resource_type.code())
                    .with_resource_name_filter(f.name.as_deref().map(s))
                    .with_pattern_type_filter(f.pattern_type.code())
                    .with_principal_filter(f.principal.as_deref().map(s))
                    .with_host_filter(f.host.as_deref().map(s))
                    .with_operation(f.operation.code())
                    .with_permission_type(f.permission.code())
            })
            .collect(),
    );
    let response: DeleteAclsResponse = client.call(&request, VERSION)?;
    for r in &response.filter_results {
        refused("DeleteAcls", r.error_code, r.error_message.as_deref())?;
    }
    gone.sort();
    gone.dedup();
    Ok(gone)
}

/// One line per binding: "TOPIC orders (LITERAL)\tUser:alice ALLOW READ from *".
pub fn show(b: &AclBinding) -> String {
    format!(
        "{} {} ({})\t{} {} {} from {}",
        b.pattern.resource_type,
        b.pattern.name,
        b.pattern.pattern_type,
        b.entry.principal,
        b.entry.permission,
        b.entry.operation,
        b.entry.host
    )
}

/// A user and their credentials' (mechanism, iterations).
pub type UserCredentials = (String, Vec<(String, i32)>);

/// Every user with a SCRAM credential.
pub fn users(bootstrap: &str) -> anyhow::Result<Vec<UserCredentials>> {
    use kafka_protocol::messages::{
        DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
    };
    let request = DescribeUserScramCredentialsRequest::default().with_users(None);
    let response: DescribeUserScramCredentialsResponse =
        AdminClient::connect(bootstrap)?.call(&request, 0)?;
    refused(
        "DescribeUserScramCredentials",
        response.error_code,
        response.error_message.as_deref(),
    )?;
    Ok(response
        .results
        .into_iter()
        .map(|r| {
            let mechanisms = r
                .credential_infos
                .iter()
                .map(|c| {
                    let name = skiff_security::ScramMechanism::from_kafka_type(c.mechanism)
                        .map_or_else(
                            || format!("mechanism {}", c.mechanism),
                            |m| m.name().to_string(),
                        );
                    (name, c.iterations)
                })
                .collect();
            (r.user.to_string(), mechanisms)
        })
        .collect())
}

/// An error code other than 0 as the error of the admin call `api`.
pub(crate) fn refused(api: &str, code: i16, message: Option<&str>) -> anyhow::Result<()> {
    if code != 0 {
        bail!("{api}: {} (error {code})", message.unwrap_or("refused"));
    }
    Ok(())
}
