//! Client quotas' admin APIs (KIP-546): AlterClientQuotas goes to the active
//! controller (`skiff_controller::access::alter_client_quotas` checks it as
//! Kafka does) and is answered once this node has applied it;
//! DescribeClientQuotas reads the core's own copy (`Security::quotas`).
//! `crate::quota` enforces what they hold.

use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::{
    alter_client_quotas_response, describe_client_quotas_response, AlterClientQuotasRequest,
    AlterClientQuotasResponse, DescribeClientQuotasRequest, DescribeClientQuotasResponse,
};
use kafka_protocol::ResponseError;
use skiff_controller::access::QuotaAlteration;
use skiff_controller::records::{QuotaEntityPart, QUOTA_CLIENT_ID, QUOTA_USER};
use skiff_security::quota::{EntityName, QuotaEntity};

use crate::kafka::str_bytes;
use crate::state::CoreState;
use crate::topics;

/// DescribeClientQuotas' match types.
const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_SPECIFIED: i8 = 2;

fn echo(
    entity: &[kafka_protocol::messages::alter_client_quotas_request::EntityData],
) -> Vec<alter_client_quotas_response::EntityData> {
    entity
        .iter()
        .map(|e| {
            alter_client_quotas_response::EntityData::default()
                .with_entity_type(e.entity_type.clone())
                .with_entity_name(e.entity_name.clone())
        })
        .collect()
}

pub async fn alter_client_quotas(
    core: &CoreState,
    request: AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    let entries: Vec<QuotaAlteration> = request
        .entries
        .iter()
        .map(|e| QuotaAlteration {
            entity: e
                .entity
                .iter()
                .map(|p| QuotaEntityPart {
                    entity_type: p.entity_type.to_string(),
                    name: p.entity_name.as_ref().map(ToString::to_string),
                })
                .collect(),
            ops: e
                .ops
                .iter()
                .map(|o| (o.key.to_string(), (!o.remove).then(|| o.value.to_bits())))
                .collect(),
        })
        .collect();
    let count = entries.len();
    let refusals = match topics::alter_client_quotas(core, entries, request.validate_only).await {
        Ok(r) => r,
        Err(e) => vec![Some(super::acls::unanswered(&e)); count],
    };
    AlterClientQuotasResponse::default().with_entries(
        request
            .entries
            .iter()
            .zip(refusals)
            .map(|(e, r)| {
                let entry =
                    alter_client_quotas_response::EntryData::default().with_entity(echo(&e.entity));
                match r {
                    None => entry,
                    Some((code, message)) => entry
                        .with_error_code(code)
                        .with_error_message(Some(str_bytes(message))),
                }
            })
            .collect(),
    )
}

/// Every entry refused with CLUSTER_AUTHORIZATION_FAILED.
pub fn alter_client_quotas_refused(
    request: &AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    AlterClientQuotasResponse::default().with_entries(
        request
            .entries
            .iter()
            .map(|e| {
                alter_client_quotas_response::EntryData::default()
                    .with_entity(echo(&e.entity))
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
            })
            .collect(),
    )
}

/// One checked filter component: the type and what its name must be.
enum Match {
    Exact(String),
    Default,
    Specified,
}

fn components(request: &[ComponentData]) -> Result<Vec<(String, Match)>, String> {
    let mut out: Vec<(String, Match)> = Vec::new();
    for c in request {
        let t = c.entity_type.to_string();
        if t != QUOTA_USER && t != QUOTA_CLIENT_ID {
            return Err(format!("Custom entity type '{t}' not supported"));
        }
        if out.iter().any(|(seen, _)| *seen == t) {
            return Err(format!("Duplicate {t} filter component entity type"));
        }
        let m = match (c.match_type, &c._match) {
            (MATCH_EXACT, Some(name)) => Match::Exact(name.to_string()),
            (MATCH_EXACT, None) => return Err(format!("{t}: an exact match needs a name")),
            (MATCH_DEFAULT, None) => Match::Default,
            (MATCH_DEFAULT, Some(_)) => return Err(format!("{t}: a default match takes no name")),
            (MATCH_SPECIFIED, _) => Match::Specified,
            (other, _) => return Err(format!("Unexpected match type {other}")),
        };
        out.push((t, m));
    }
    Ok(out)
}

fn part(entity: &QuotaEntity, t: &str) -> Option<Option<String>> {
    let name = if t == QUOTA_USER {
        entity.user.as_ref()
    } else {
        entity.client_id.as_ref()
    }?;
    Some(match name {
        EntityName::Named(n) => Some(n.clone()),
        EntityName::Default => None,
    })
}

pub fn describe_client_quotas(
    core: &CoreState,
    request: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    let filter = match components(&request.components) {
        Ok(f) => f,
        Err(message) => {
            return DescribeClientQuotasResponse::default()
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(Some(str_bytes(message)))
        }
    };
    let table = core.topics();
    let entries = table
        .security
        .quotas
        .entries()
        .filter(|(entity, _)| {
            let parts = [QUOTA_USER, QUOTA_CLIENT_ID]
                .into_iter()
                .filter(|t| part(entity, t).is_some())
                .count();
            if request.strict && parts != filter.len() {
                return false;
            }
            filter.iter().all(|(t, m)| match (part(entity, t), m) {
                (Some(Some(name)), Match::Exact(want)) => name == *want,
                (Some(None), Match::Default) => true,
                (Some(_), Match::Specified) => true,
                _ => false,
            })
        })
        .map(|(entity, values)| {
            let entity = [QUOTA_USER, QUOTA_CLIENT_ID]
                .into_iter()
                .filter_map(|t| {
                    part(entity, t).map(|name| {
                        describe_client_quotas_response::EntityData::default()
                            .with_entity_type(str_bytes(t))
                            .with_entity_name(name.map(str_bytes))
                    })
                })
                .collect();
            let values = values
                .iter()
                .map(|(k, v)| {
                    describe_client_quotas_response::ValueData::default()
                        .with_key(str_bytes(k.name()))
                        .with_value(*v)
                })
                .collect();
            describe_client_quotas_response::EntryData::default()
                .with_entity(entity)
                .with_values(values)
        })
        .collect();
    DescribeClientQuotasResponse::default().with_entries(Some(entries))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::StrBytes;

    fn component(t: &str, match_type: i8, name: Option<&str>) -> ComponentData {
        ComponentData::default()
            .with_entity_type(StrBytes::from_string(t.to_string()))
            .with_match_type(match_type)
            .with_match(name.map(|n| StrBytes::from_string(n.to_string())))
    }

    #[test]
    fn bad_describe_filters_are_refused_with_the_reason() {
        let cases = [
            (vec![component("group", 0, Some("g"))], "not supported"),
            (
                vec![component("user", 2, None), component("user", 0, Some("a"))],
                "Duplicate",
            ),
            (vec![component("user", 0, None)], "needs a name"),
            (vec![component("client-id", 1, Some("x"))], "takes no name"),
            (vec![component("user", 7, None)], "match type 7"),
        ];
        for (filter, why) in cases {
            match components(&filter) {
                Err(e) => assert!(e.contains(why), "{e:?} should say {why:?}"),
                Ok(_) => panic!("{why}: accepted"),
            }
        }
        assert!(components(&[component("user", 1, None), component("client-id", 2, None)]).is_ok());
    }
}
