//! `skiff quota set | remove | list`: client quotas over the Kafka port
//! (AlterClientQuotas, DescribeClientQuotas), as `kafka-configs.sh
//! --entity-type users|clients` uses them.

use anyhow::bail;
use kafka_protocol::messages::{
    alter_client_quotas_request, describe_client_quotas_request, AlterClientQuotasRequest,
    AlterClientQuotasResponse, DescribeClientQuotasRequest, DescribeClientQuotasResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::acl_admin::refused;
use crate::admin_client::AdminClient;

/// v1: flexible, the same fields as v0.
const VERSION: i16 = 1;

/// One component of an entity as the command line names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Name {
    Named(String),
    /// `<default>`: every user (client id) without a quota of its own.
    Default,
}

/// An entity: a user, a client id or both.
#[derive(Debug, Clone, Default)]
pub struct Entity {
    pub user: Option<Name>,
    pub client_id: Option<Name>,
}

impl Entity {
    fn parts(&self) -> Vec<(&'static str, Option<String>)> {
        let name = |n: &Name| match n {
            Name::Named(s) => Some(s.clone()),
            Name::Default => None,
        };
        let mut out = Vec::new();
        if let Some(u) = &self.user {
            out.push(("user", name(u)));
        }
        if let Some(c) = &self.client_id {
            out.push(("client-id", name(c)));
        }
        out
    }
}

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

/// Parses `key=value` (`producer_byte_rate=1048576`).
pub fn parse_setting(text: &str) -> anyhow::Result<(String, f64)> {
    let Some((key, value)) = text.split_once('=') else {
        bail!("{text:?}: expected KEY=VALUE, e.g. producer_byte_rate=1048576");
    };
    let value: f64 = value
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("{text:?}: the value is not a number"))?;
    Ok((key.trim().to_string(), value))
}

/// Sets and removes quotas of one entity (one AlterClientQuotas entry).
pub fn alter(
    bootstrap: &str,
    entity: &Entity,
    set: &[(String, f64)],
    remove: &[String],
) -> anyhow::Result<()> {
    if entity.user.is_none() && entity.client_id.is_none() {
        bail!("name a --user or a --client-id (or their --*-default)");
    }
    if set.is_empty() && remove.is_empty() {
        bail!("nothing to change: give --set KEY=VALUE or --remove KEY");
    }
    let ops = set
        .iter()
        .map(|(k, v)| {
            alter_client_quotas_request::OpData::default()
                .with_key(s(k))
                .with_value(*v)
        })
        .chain(remove.iter().map(|k| {
            alter_client_quotas_request::OpData::default()
                .with_key(s(k))
                .with_remove(true)
        }))
        .collect();
    let entry = alter_client_quotas_request::EntryData::default()
        .with_entity(
            entity
                .parts()
                .into_iter()
                .map(|(t, n)| {
                    alter_client_quotas_request::EntityData::default()
                        .with_entity_type(s(t))
                        .with_entity_name(n.as_deref().map(s))
                })
                .collect(),
        )
        .with_ops(ops);
    let request = AlterClientQuotasRequest::default().with_entries(vec![entry]);
    let response: AlterClientQuotasResponse =
        AdminClient::connect(bootstrap)?.call(&request, VERSION)?;
    for e in &response.entries {
        refused(
            "AlterClientQuotas",
            e.error_code,
            e.error_message.as_deref(),
        )?;
    }
    Ok(())
}

/// The quotas of the entities that match `filter` (a component not named
/// matches anything, as `kafka-configs.sh --describe` without a name).
pub fn list(bootstrap: &str, filter: &Entity) -> anyhow::Result<Vec<String>> {
    let components = filter
        .parts()
        .into_iter()
        .map(|(t, n)| {
            let c = describe_client_quotas_request::ComponentData::default().with_entity_type(s(t));
            match n {
                Some(name) => c.with_match_type(0).with_match(Some(s(&name))),
                None => c.with_match_type(1).with_match(None),
            }
        })
        .collect();
    let request = DescribeClientQuotasRequest::default()
        .with_components(components)
        .with_strict(false);
    let response: DescribeClientQuotasResponse =
        AdminClient::connect(bootstrap)?.call(&request, VERSION)?;
    refused(
        "DescribeClientQuotas",
        response.error_code,
        response.error_message.as_deref(),
    )?;
    Ok(response
        .entries
        .unwrap_or_default()
        .iter()
        .map(|e| {
            let entity: Vec<String> = e
                .entity
                .iter()
                .map(|p| {
                    format!(
                        "{}={}",
                        p.entity_type,
                        p.entity_name.as_deref().unwrap_or("<default>")
                    )
                })
                .collect();
            let values: Vec<String> = e
                .values
                .iter()
                .map(|v| format!("{}={}", v.key, v.value))
                .collect();
            format!("{} {}", entity.join(" "), values.join(" "))
        })
        .collect())
}
