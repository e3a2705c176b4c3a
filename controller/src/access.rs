//! The controller's decisions on who may connect and what they may do: SCRAM
//! credentials (AlterUserScramCredentials) and ACLs (CreateAcls, DeleteAcls),
//! checked as Kafka's `ScramControlManager` and `AclControlManager` check
//! them, and client quotas (AlterClientQuotas, as `ClientQuotaControlManager`),
//! turned into metadata records. Pure functions of the state, like
//! `decisions`; `skiff_security` says what the codes mean.

use std::collections::{BTreeMap, BTreeSet};

use rkyv::{Archive, Deserialize, Serialize};
use skiff_security::quota::{check_value, EntityName, QuotaEntity, QuotaError, QuotaKey, Quotas};
use skiff_security::{
    AccessControlEntry, AclBinding, AclBindingFilter, AclError, AclOperation, AclPermission,
    PatternType, ResourcePattern, ResourceType, ScramCredential, ScramMechanism,
};

use crate::decisions::ControllerError;
use crate::records::{
    AclRecord, ClientQuotaRecord, MetadataRecord, QuotaEntityPart, RemoveUserScramCredential,
    UserScramCredential, QUOTA_CLIENT_ID, QUOTA_USER,
};
use crate::state::ClusterState;

/// One entry of AlterUserScramCredentials.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq)]
pub enum ScramAlteration {
    /// Sets the user's credential for the mechanism; the client sends the
    /// salted password (PBKDF2 of the password), never the password.
    Upsert {
        name: String,
        mechanism: i8,
        iterations: i32,
        salt: Vec<u8>,
        salted_password: Vec<u8>,
    },
    Delete {
        name: String,
        mechanism: i8,
    },
}

impl std::fmt::Debug for ScramAlteration {
    /// The salted password is as good as the password: never in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScramAlteration::Upsert {
                name,
                mechanism,
                iterations,
                ..
            } => write!(
                f,
                "Upsert({name:?}, mechanism {mechanism}, {iterations} iterations)"
            ),
            ScramAlteration::Delete { name, mechanism } => {
                write!(f, "Delete({name:?}, mechanism {mechanism})")
            }
        }
    }
}

impl ScramAlteration {
    pub fn name(&self) -> &str {
        match self {
            ScramAlteration::Upsert { name, .. } | ScramAlteration::Delete { name, .. } => name,
        }
    }

    fn mechanism(&self) -> i8 {
        match self {
            ScramAlteration::Upsert { mechanism, .. }
            | ScramAlteration::Delete { mechanism, .. } => *mechanism,
        }
    }
}

/// A user named in AlterUserScramCredentials and what became of it.
pub type UserResult = (String, Result<(), ControllerError>);

/// One result per user named (in the order first named) and the records for
/// the users whose every alteration is acceptable: a user with one bad entry
/// gets none of its entries applied.
pub fn alter_scram_credentials(
    state: &ClusterState,
    alterations: &[ScramAlteration],
) -> (Vec<UserResult>, Vec<MetadataRecord>) {
    let mut users: Vec<String> = Vec::new();
    let mut errors: BTreeMap<String, ControllerError> = BTreeMap::new();
    let mut seen: BTreeSet<(String, i8)> = BTreeSet::new();
    let mut planned: BTreeMap<String, Vec<MetadataRecord>> = BTreeMap::new();
    for a in alterations {
        let name = a.name().to_string();
        if !users.contains(&name) {
            users.push(name.clone());
        }
        if errors.contains_key(&name) {
            continue;
        }
        match check_alteration(state, a, &mut seen) {
            Ok(record) => planned.entry(name).or_default().push(record),
            Err(e) => {
                errors.insert(name, e);
            }
        }
    }
    let mut records = Vec::new();
    let results = users
        .into_iter()
        .map(|u| match errors.remove(&u) {
            Some(e) => (u, Err(e)),
            None => {
                records.extend(planned.remove(&u).unwrap_or_default());
                (u, Ok(()))
            }
        })
        .collect();
    (results, records)
}

fn check_alteration(
    state: &ClusterState,
    a: &ScramAlteration,
    seen: &mut BTreeSet<(String, i8)>,
) -> Result<MetadataRecord, ControllerError> {
    let name = a.name();
    if name.is_empty() {
        return Err(ControllerError::UnacceptableCredential(
            "Username must not be empty".into(),
        ));
    }
    let mechanism = a.mechanism();
    ScramMechanism::from_kafka_type(mechanism)
        .ok_or(ControllerError::UnsupportedSaslMechanism(mechanism))?;
    if !seen.insert((name.to_string(), mechanism)) {
        return Err(ControllerError::DuplicateResource(
            "A user credential cannot be altered twice in the same request".into(),
        ));
    }
    match a {
        ScramAlteration::Delete { .. } => {
            if state.scram_credential(name, mechanism).is_none() {
                return Err(ControllerError::ResourceNotFound(
                    "Attempt to delete a user credential that does not exist".into(),
                ));
            }
            Ok(MetadataRecord::RemoveUserScramCredential(
                RemoveUserScramCredential {
                    name: name.to_string(),
                    mechanism,
                },
            ))
        }
        ScramAlteration::Upsert {
            iterations,
            salt,
            salted_password,
            ..
        } => {
            let iterations = ScramCredential::check_iterations(*iterations)
                .map_err(|e| ControllerError::UnacceptableCredential(e.to_string()))?;
            if salt.is_empty() || salted_password.is_empty() {
                return Err(ControllerError::UnacceptableCredential(
                    "salt and salted password must not be empty".into(),
                ));
            }
            let Some(m) = ScramMechanism::from_kafka_type(mechanism) else {
                return Err(ControllerError::UnsupportedSaslMechanism(mechanism));
            };
            let c = ScramCredential::from_salted_password(m, salt, salted_password, iterations);
            Ok(MetadataRecord::UserScramCredential(UserScramCredential {
                name: name.to_string(),
                mechanism,
                salt: c.salt,
                stored_key: c.stored_key,
                server_key: c.server_key,
                iterations,
            }))
        }
    }
}

/// "SCRAM-SHA-256" for Kafka's mechanism type 1, and so on.
pub fn scram_mechanism_name(code: i8) -> Option<&'static str> {
    ScramMechanism::from_kafka_type(code).map(ScramMechanism::name)
}

/// The binding a record holds, or why its codes mean nothing.
pub fn acl_binding(r: &AclRecord) -> Result<AclBinding, AclError> {
    let code = |what: &'static str, code: i8| AclError::UnknownCode { what, code };
    Ok(AclBinding {
        pattern: ResourcePattern {
            resource_type: ResourceType::from_code(r.resource_type)
                .ok_or(code("resource type", r.resource_type))?,
            name: r.resource_name.clone(),
            pattern_type: PatternType::from_code(r.pattern_type)
                .ok_or(code("pattern type", r.pattern_type))?,
        },
        entry: AccessControlEntry {
            principal: r.principal.clone(),
            host: r.host.clone(),
            operation: AclOperation::from_code(r.operation)
                .ok_or(code("operation", r.operation))?,
            permission: AclPermission::from_code(r.permission)
                .ok_or(code("permission", r.permission))?,
        },
    })
}

pub fn acl_record(b: &AclBinding) -> AclRecord {
    AclRecord {
        resource_type: b.pattern.resource_type.code(),
        resource_name: b.pattern.name.clone(),
        pattern_type: b.pattern.pattern_type.code(),
        principal: b.entry.principal.clone(),
        host: b.entry.host.clone(),
        operation: b.entry.operation.code(),
        permission: b.entry.permission.code(),
    }
}

/// The state's ACLs as bindings (records whose codes mean nothing are left out;
/// `create_acls` never writes one).
pub fn acl_bindings(state: &ClusterState) -> Vec<AclBinding> {
    state
        .acls()
        .iter()
        .filter_map(|r| acl_binding(r).ok())
        .collect()
}

/// A DescribeAcls or DeleteAcls filter as it travels to the controller:
/// Kafka's codes, `None` for "any" names.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct AclFilterRecord {
    pub resource_type: i8,
    pub resource_name: Option<String>,
    pub pattern_type: i8,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: i8,
    pub permission: i8,
}

impl AclFilterRecord {
    pub fn from_filter(f: &AclBindingFilter) -> Self {
        AclFilterRecord {
            resource_type: f.resource_type.code(),
            resource_name: f.name.clone(),
            pattern_type: f.pattern_type.code(),
            principal: f.principal.clone(),
            host: f.host.clone(),
            operation: f.operation.code(),
            permission: f.permission.code(),
        }
    }

    /// The filter, or which code means nothing.
    pub fn filter(&self) -> Result<AclBindingFilter, AclError> {
        let code = |what: &'static str, code: i8| AclError::UnknownCode { what, code };
        Ok(AclBindingFilter {
            resource_type: ResourceType::from_code(self.resource_type)
                .ok_or(code("resource type", self.resource_type))?,
            name: self.resource_name.clone(),
            pattern_type: PatternType::from_code(self.pattern_type)
                .ok_or(code("pattern type", self.pattern_type))?,
            principal: self.principal.clone(),
            host: self.host.clone(),
            operation: AclOperation::from_code(self.operation)
                .ok_or(code("operation", self.operation))?,
            permission: AclPermission::from_code(self.permission)
                .ok_or(code("permission", self.permission))?,
        })
    }
}

/// CreateAcls: one result per binding, in order; a binding that exists
/// already succeeds without a record.
pub fn create_acls(
    state: &ClusterState,
    bindings: &[AclRecord],
) -> (Vec<Result<(), ControllerError>>, Vec<MetadataRecord>) {
    let mut records = Vec::new();
    let mut added: BTreeSet<&AclRecord> = BTreeSet::new();
    let results = bindings
        .iter()
        .map(|r| {
            let b = acl_binding(r).map_err(|e| ControllerError::InvalidRequest(e.to_string()))?;
            b.validate()
                .map_err(|e| ControllerError::InvalidRequest(e.to_string()))?;
            if !state.acls().contains(r) && added.insert(r) {
                records.push(MetadataRecord::Acl(r.clone()));
            }
            Ok(())
        })
        .collect();
    (results, records)
}

/// DeleteAcls: per filter, the bindings it matches (each removed once, by
/// the first filter that matches it), or why the filter means nothing.
pub fn delete_acls(
    state: &ClusterState,
    filters: &[AclFilterRecord],
) -> (
    Vec<Result<Vec<AclRecord>, ControllerError>>,
    Vec<MetadataRecord>,
) {
    let bindings: Vec<(AclRecord, AclBinding)> = state
        .acls()
        .iter()
        .filter_map(|r| Some((r.clone(), acl_binding(r).ok()?)))
        .collect();
    let mut removed: BTreeSet<AclRecord> = BTreeSet::new();
    let mut records = Vec::new();
    let results = filters
        .iter()
        .map(|f| {
            let f = f
                .filter()
                .map_err(|e| ControllerError::InvalidRequest(e.to_string()))?;
            Ok(bindings
                .iter()
                .filter(|(_, b)| f.matches(b))
                .map(|(r, _)| {
                    if removed.insert(r.clone()) {
                        records.push(MetadataRecord::RemoveAcl(r.clone()));
                    }
                    r.clone()
                })
                .collect())
        })
        .collect();
    (results, records)
}

/// One entry of AlterClientQuotas: an entity and the quotas to set (`Some`)
/// or remove (`None`) on it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct QuotaAlteration {
    /// As the client sent it: any order, possibly bad types or duplicates.
    pub entity: Vec<QuotaEntityPart>,
    /// (key, `f64::to_bits` of the value or `None` to remove).
    pub ops: Vec<(String, Option<u64>)>,
}

/// AlterClientQuotas, as Kafka's `ClientQuotaControlManager` checks it: one
/// result per entry, and the records of the entries that are acceptable
/// (none when `validate_only`). An entry with one bad op gets none applied.
pub fn alter_client_quotas(
    entries: &[QuotaAlteration],
    validate_only: bool,
) -> (Vec<Result<(), ControllerError>>, Vec<MetadataRecord>) {
    let mut records = Vec::new();
    let results = entries
        .iter()
        .map(|e| {
            let planned = check_quota_alteration(e)?;
            if !validate_only {
                records.extend(planned);
            }
            Ok(())
        })
        .collect();
    (results, records)
}

fn check_quota_alteration(e: &QuotaAlteration) -> Result<Vec<MetadataRecord>, ControllerError> {
    let bad = |m: String| ControllerError::InvalidRequest(m);
    if e.entity.is_empty() {
        return Err(bad(
            "a quota entity names a user, a client id or both".into()
        ));
    }
    let mut entity = e.entity.clone();
    entity.sort();
    for (i, part) in entity.iter().enumerate() {
        match part.entity_type.as_str() {
            QUOTA_USER | QUOTA_CLIENT_ID => {}
            "ip" => {
                return Err(bad(
                    "ip quotas (connection_creation_rate) are not supported: use max.connections.per.ip.overrides".into(),
                ))
            }
            other => return Err(bad(format!("Unhandled client quota entity type: {other}"))),
        }
        if entity[..i]
            .iter()
            .any(|p| p.entity_type == part.entity_type)
        {
            return Err(bad(format!(
                "Duplicate {} entity in the request",
                part.entity_type
            )));
        }
        if part.name.as_deref() == Some("") && part.entity_type == QUOTA_USER {
            return Err(bad("a user entity's name must not be empty".into()));
        }
    }
    let mut keys = BTreeSet::new();
    let mut records = Vec::new();
    for (key, value) in &e.ops {
        let k = QuotaKey::parse(key)
            .ok_or_else(|| bad(QuotaError::UnknownKey(key.clone()).to_string()))?;
        if !keys.insert(key.as_str()) {
            return Err(bad(format!("Duplicate quota key {key} for one entity")));
        }
        if let Some(bits) = value {
            check_value(k, f64::from_bits(*bits)).map_err(|e| bad(e.to_string()))?;
        }
        records.push(MetadataRecord::ClientQuota(ClientQuotaRecord {
            entity: entity.clone(),
            key: key.clone(),
            value_bits: *value,
        }));
    }
    Ok(records)
}

/// The state's client quotas in `skiff_security`'s terms (for enforcement):
/// entities of user and client-id parts, which is every entity the
/// controller accepts.
pub fn quotas(state: &ClusterState) -> Quotas {
    let mut out = Quotas::default();
    for (entity, key, value) in state.client_quotas() {
        let name = |t: &str| {
            entity
                .iter()
                .find(|p| p.entity_type == t)
                .map(|p| match &p.name {
                    Some(n) => EntityName::Named(n.clone()),
                    None => EntityName::Default,
                })
        };
        if let (Ok(entity), Some(key)) = (
            QuotaEntity::new(name(QUOTA_USER), name(QUOTA_CLIENT_ID)),
            QuotaKey::parse(key),
        ) {
            out.set(entity, key, Some(value));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn upsert(name: &str, mechanism: i8, iterations: i32) -> ScramAlteration {
        ScramAlteration::Upsert {
            name: name.into(),
            mechanism,
            iterations,
            salt: b"salt".to_vec(),
            salted_password: vec![7; 32],
        }
    }

    fn delete(name: &str, mechanism: i8) -> ScramAlteration {
        ScramAlteration::Delete {
            name: name.into(),
            mechanism,
        }
    }

    fn applied(records: &[MetadataRecord]) -> ClusterState {
        let mut s = ClusterState::new();
        assert_eq!(s.apply_batch(1, records), vec![]);
        s
    }

    #[test]
    fn scram_upserts_and_deletes_with_kafkas_errors() {
        let (results, records) = alter_scram_credentials(
            &ClusterState::new(),
            &[upsert("alice", 1, 4096), upsert("alice", 2, 8192)],
        );
        assert_eq!(results, vec![("alice".to_string(), Ok(()))]);
        let state = applied(&records);
        let c = state.scram_credential("alice", 1).unwrap();
        // What the server keeps verifies the password the salted one came from.
        let m = ScramMechanism::Sha256;
        let salted = m.salted_password(b"pw", b"salt", 4096);
        let (_, records) = alter_scram_credentials(
            &state,
            &[ScramAlteration::Upsert {
                name: "bob".into(),
                mechanism: 1,
                iterations: 4096,
                salt: b"salt".to_vec(),
                salted_password: salted,
            }],
        );
        let MetadataRecord::UserScramCredential(bob) = &records[0] else {
            panic!("{records:?}")
        };
        let cred = ScramCredential {
            mechanism: m,
            salt: bob.salt.clone(),
            stored_key: bob.stored_key.clone(),
            server_key: bob.server_key.clone(),
            iterations: bob.iterations,
        };
        assert!(cred.verify_password("pw") && !cred.verify_password("px"));
        assert_eq!(c.iterations, 4096);
        assert_eq!(state.scram_credential("alice", 2).unwrap().iterations, 8192);

        let (results, records) = alter_scram_credentials(
            &state,
            &[
                delete("alice", 1),
                upsert("carol", 3, 4096),
                upsert("dave", 1, 4095),
                upsert("erin", 2, 16385),
                delete("frank", 1),
                upsert("", 1, 4096),
                upsert("gina", 1, 4096),
                delete("gina", 1),
            ],
        );
        let codes: Vec<(String, i16)> = results
            .iter()
            .map(|(u, r)| {
                (
                    u.clone(),
                    r.as_ref().map_or_else(|e| e.kafka_code(), |()| 0),
                )
            })
            .collect();
        assert_eq!(
            codes,
            vec![
                ("alice".into(), 0),
                ("carol".into(), 33),
                ("dave".into(), 93),
                ("erin".into(), 93),
                ("frank".into(), 91),
                ("".into(), 93),
                ("gina".into(), 92),
            ]
        );
        // Only alice's deletion is written: gina's good upsert goes with her bad entry.
        assert_eq!(
            records,
            vec![MetadataRecord::RemoveUserScramCredential(
                RemoveUserScramCredential {
                    name: "alice".into(),
                    mechanism: 1
                }
            )]
        );
    }

    fn acl(name: &str, pattern: PatternType, who: &str, op: AclOperation) -> AclRecord {
        acl_record(&AclBinding {
            pattern: ResourcePattern {
                resource_type: ResourceType::Topic,
                name: name.into(),
                pattern_type: pattern,
            },
            entry: AccessControlEntry {
                principal: who.into(),
                host: "*".into(),
                operation: op,
                permission: AclPermission::Allow,
            },
        })
    }

    #[test]
    fn acls_are_validated_created_once_and_deleted_by_filter() {
        let a = acl("orders", PatternType::Literal, "User:a", AclOperation::Read);
        let b = acl("ord", PatternType::Prefixed, "User:b", AclOperation::Write);
        let mut bad_code = a.clone();
        bad_code.operation = 99;
        let bad_principal = acl("orders", PatternType::Literal, "alice", AclOperation::Read);
        let (results, records) = create_acls(
            &ClusterState::new(),
            &[a.clone(), b.clone(), a.clone(), bad_code, bad_principal],
        );
        let codes: Vec<i16> = results
            .iter()
            .map(|r| r.as_ref().map_or_else(|e| e.kafka_code(), |()| 0))
            .collect();
        assert_eq!(codes, vec![0, 0, 0, 42, 42]);
        assert_eq!(
            records.len(),
            2,
            "a duplicate in one request is written once"
        );
        let state = applied(&records);
        assert_eq!(acl_bindings(&state).len(), 2);
        let (results, records) = create_acls(&state, std::slice::from_ref(&a));
        assert_eq!(
            (results, records.len()),
            (vec![Ok(())], 0),
            "an existing binding"
        );

        let matching_orders = AclBindingFilter {
            name: Some("orders".into()),
            pattern_type: PatternType::Match,
            ..AclBindingFilter::any()
        };
        let mut bad = AclFilterRecord::from_filter(&AclBindingFilter::any());
        bad.operation = 0;
        let (matched, records) = delete_acls(
            &state,
            &[
                AclFilterRecord::from_filter(&matching_orders),
                AclFilterRecord::from_filter(&AclBindingFilter::any()),
                bad,
            ],
        );
        assert_eq!(
            matched[0].as_ref().unwrap().len(),
            2,
            "MATCH: the literal and the prefix that covers it"
        );
        assert_eq!(matched[1].as_ref().unwrap().len(), 2);
        assert_eq!(matched[2].as_ref().map_err(|e| e.kafka_code()), Err(42));
        assert_eq!(records.len(), 2, "each removed once");
        let mut state = state;
        assert_eq!(state.apply_batch(2, &records), vec![]);
        assert!(state.acls().is_empty());
        // Removing what is gone changes nothing and is not refused.
        assert_eq!(state.apply_batch(3, &records), vec![]);
    }

    #[test]
    fn credentials_and_acls_survive_a_snapshot() {
        let (_, mut records) =
            alter_scram_credentials(&ClusterState::new(), &[upsert("alice", 2, 4096)]);
        records.extend(
            create_acls(
                &ClusterState::new(),
                &[acl(
                    "t",
                    PatternType::Literal,
                    "User:alice",
                    AclOperation::All,
                )],
            )
            .1,
        );
        let state = applied(&records);
        let back = ClusterState::from_snapshot(&state.to_snapshot()).unwrap();
        assert_eq!(back, state);
        assert_eq!(
            back.scram_credential("alice", 2),
            state.scram_credential("alice", 2)
        );
        assert_eq!(back.acls().len(), 1);
    }

    fn quota_entry(parts: &[(&str, Option<&str>)], ops: &[(&str, Option<f64>)]) -> QuotaAlteration {
        QuotaAlteration {
            entity: parts
                .iter()
                .map(|(t, n)| QuotaEntityPart {
                    entity_type: t.to_string(),
                    name: n.map(Into::into),
                })
                .collect(),
            ops: ops
                .iter()
                .map(|(k, v)| (k.to_string(), v.map(f64::to_bits)))
                .collect(),
        }
    }

    #[test]
    fn client_quotas_are_set_removed_and_resolved() {
        let set = [
            quota_entry(
                &[("client-id", Some("etl")), ("user", Some("alice"))],
                &[
                    ("producer_byte_rate", Some(1024.0)),
                    ("consumer_byte_rate", Some(2048.0)),
                ],
            ),
            quota_entry(&[("user", None)], &[("producer_byte_rate", Some(100.0))]),
        ];
        let (results, records) = alter_client_quotas(&set, false);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let mut state = applied(&records);
        // The entity is stored with its parts sorted, whatever the order sent.
        let alice_etl = [
            QuotaEntityPart {
                entity_type: "client-id".into(),
                name: Some("etl".into()),
            },
            QuotaEntityPart {
                entity_type: "user".into(),
                name: Some("alice".into()),
            },
        ];
        assert_eq!(
            state.client_quota(&alice_etl, "producer_byte_rate"),
            Some(1024.0)
        );
        let q = quotas(&state);
        let r = q
            .resolve("alice", "etl", QuotaKey::ProducerByteRate)
            .unwrap();
        assert_eq!(r.limit, 1024.0);
        let r = q.resolve("bob", "etl", QuotaKey::ProducerByteRate).unwrap();
        assert_eq!(
            (r.limit, r.budget),
            (100.0, ("bob".to_string(), String::new()))
        );
        assert!(q
            .resolve("bob", "etl", QuotaKey::ConsumerByteRate)
            .is_none());

        // Removing one key keeps the other; removing a missing one is no error.
        let remove = [quota_entry(
            &[("user", Some("alice")), ("client-id", Some("etl"))],
            &[("producer_byte_rate", None), ("request_percentage", None)],
        )];
        let (results, records) = alter_client_quotas(&remove, false);
        assert!(results.iter().all(Result::is_ok));
        assert!(state.apply_batch(2, &records).is_empty());
        assert_eq!(state.client_quota(&alice_etl, "producer_byte_rate"), None);
        assert_eq!(
            state.client_quota(&alice_etl, "consumer_byte_rate"),
            Some(2048.0)
        );
        assert_eq!(state.client_quotas().count(), 2);

        // validate_only checks and writes nothing.
        let (results, records) = alter_client_quotas(&set, true);
        assert!(results.iter().all(Result::is_ok) && records.is_empty());
    }

    #[test]
    fn bad_quota_entries_are_refused_alone_with_invalid_request() {
        let entries = [
            quota_entry(&[], &[("producer_byte_rate", Some(1.0))]),
            quota_entry(
                &[("group", Some("g"))],
                &[("producer_byte_rate", Some(1.0))],
            ),
            quota_entry(
                &[("ip", Some("10.0.0.1"))],
                &[("connection_creation_rate", Some(1.0))],
            ),
            quota_entry(
                &[("user", Some("a")), ("user", Some("b"))],
                &[("producer_byte_rate", Some(1.0))],
            ),
            quota_entry(&[("user", Some("a"))], &[("produce_byte_rate", Some(1.0))]),
            quota_entry(
                &[("user", Some("a"))],
                &[
                    ("producer_byte_rate", Some(1.0)),
                    ("producer_byte_rate", Some(2.0)),
                ],
            ),
            quota_entry(&[("user", Some("a"))], &[("producer_byte_rate", Some(0.0))]),
            quota_entry(
                &[("user", Some("a"))],
                &[("consumer_byte_rate", Some(f64::NAN))],
            ),
            // One bad op spoils its entry only.
            quota_entry(
                &[("user", Some("a"))],
                &[
                    ("consumer_byte_rate", Some(10.0)),
                    ("producer_byte_rate", Some(-1.0)),
                ],
            ),
            quota_entry(
                &[("client-id", None)],
                &[("request_percentage", Some(25.0))],
            ),
        ];
        let (results, records) = alter_client_quotas(&entries, false);
        for (i, r) in results.iter().enumerate().take(entries.len() - 1) {
            match r {
                Err(e) => assert_eq!(e.kafka_code(), 42, "entry {i}: {e}"),
                Ok(()) => panic!("entry {i} accepted"),
            }
        }
        assert!(results.last().unwrap().is_ok());
        assert_eq!(
            records.len(),
            1,
            "only the good entry's record: {records:?}"
        );
    }
}
