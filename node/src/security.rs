//! Each core's copy of the cluster's security metadata: SCRAM credentials,
//! ACL bindings and client quotas, derived on core 0 from the committed metadata state (as the
//! topic table is) and shared read-only with every core inside the
//! `TopicTable`, so a connection's core reads them without a cross-core call.
//! Rebuilt only when a metadata batch touched them (`Broker::security_dirty`).

use std::collections::BTreeMap;
use std::rc::Rc;

use skiff_controller::access;
use skiff_controller::state::ClusterState;
use skiff_security::quota::Quotas;
use skiff_security::{AclBinding, Authorizer, KafkaPrincipal, ScramCredential, ScramMechanism};

/// Who sent a request, as authorization and quotas see it: one per
/// connection (again after a re-authentication).
#[derive(Debug, Clone)]
pub struct Session {
    pub principal: KafkaPrincipal,
    /// The client's IP address as ACL hosts name it ("127.0.0.1").
    pub ip: String,
    /// Kafka's client host string ("/127.0.0.1"), for group membership.
    pub client_host: Rc<str>,
    /// The listener the connection came in on: Metadata and FindCoordinator
    /// answer with that listener's endpoints.
    pub listener: Rc<str>,
    /// The connection's quota mute (`crate::quota`): shared by the sessions
    /// of one connection.
    pub mute: Rc<crate::quota::Mute>,
}

/// How the node authorizes (`authorizer.class.name`, `super.users`,
/// `allow.everyone.if.no.acl.found`); `None` in `Security::from_state`: it
/// does not.
#[derive(Debug, Clone)]
pub struct AuthzSettings {
    pub super_users: Vec<String>,
    pub allow_if_no_acl: bool,
}

#[derive(Debug, Default)]
pub struct Security {
    /// Every ACL binding, in a stable order (DescribeAcls).
    pub acls: Vec<AclBinding>,
    /// user -> their credentials (at most one per mechanism).
    pub credentials: BTreeMap<String, Vec<ScramCredential>>,
    /// The ACLs indexed for decisions; `None`: no authorizer configured,
    /// everything is allowed.
    pub authorizer: Option<Authorizer>,
    /// Client quotas (`crate::quota` enforces them; DescribeClientQuotas).
    pub quotas: Quotas,
}

impl Security {
    pub fn from_state(state: &ClusterState, authz: Option<&AuthzSettings>) -> Self {
        let mut credentials: BTreeMap<String, Vec<ScramCredential>> = BTreeMap::new();
        for c in state.scram_credentials() {
            let Some(mechanism) = ScramMechanism::from_kafka_type(c.mechanism) else {
                continue; // the state refuses such records; nothing to serve
            };
            credentials
                .entry(c.name.clone())
                .or_default()
                .push(ScramCredential {
                    mechanism,
                    salt: c.salt.clone(),
                    stored_key: c.stored_key.clone(),
                    server_key: c.server_key.clone(),
                    iterations: c.iterations,
                });
        }
        let acls = access::acl_bindings(state);
        let authorizer =
            authz.map(|a| Authorizer::new(&acls, a.super_users.iter().cloned(), a.allow_if_no_acl));
        Security {
            acls,
            credentials,
            authorizer,
            quotas: access::quotas(state),
        }
    }

    /// `user`'s credential for `mechanism`.
    pub fn credential(&self, user: &str, mechanism: ScramMechanism) -> Option<&ScramCredential> {
        self.credentials
            .get(user)?
            .iter()
            .find(|c| c.mechanism == mechanism)
    }
}

/// Per DeleteAcls filter: the bindings removed, or the refusal (code, text).
pub type DeletedAcls = Vec<Result<Vec<skiff_controller::records::AclRecord>, (i16, String)>>;

/// Whether a metadata record changes what `Security` holds.
pub fn touches(record: &skiff_controller::records::MetadataRecord) -> bool {
    use skiff_controller::records::MetadataRecord as R;
    matches!(
        record,
        R::UserScramCredential(_)
            | R::RemoveUserScramCredential(_)
            | R::Acl(_)
            | R::RemoveAcl(_)
            | R::ClientQuota(_)
    )
}
