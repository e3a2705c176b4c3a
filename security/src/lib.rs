//! skiff's authentication and authorization rules, sans I/O.
//!
//! The node's connection handler (on the core that accepted the connection)
//! feeds SASL tokens to an exchange from here and asks an [`Authorizer`]
//! (the core's own copy of the cluster's ACLs) before it serves a request;
//! nothing here reads a socket, a file or a clock, so every rule is tested
//! without them:
//!
//! ```text
//! SaslHandshake(mechanism) -> Mechanism::parse
//! SaslAuthenticate(bytes)  -> plain::parse + ScramCredential::verify_password
//!                           | ScramServer::client_first -> client_final
//!                          => the connection's KafkaPrincipal
//! every request            -> Authorizer::authorize(principal, host, op, resource)
//! ```
//!
//! SCRAM credentials and ACL bindings are records of the metadata log (the
//! controller replicates them); this crate only says what they mean.

pub mod acl;
pub mod peer_auth;
pub mod plain;
pub mod principal;
pub mod principal_mapping;
pub mod quota;
pub mod scram;

pub use acl::{
    AccessControlEntry, AclBinding, AclBindingFilter, AclError, AclOperation, AclPermission, Acls,
    Authorizer, PatternType, ResourcePattern, ResourceType,
};
pub use peer_auth::{PeerAuthError, SharedSecret};
pub use plain::{PlainError, PlainMessage};
pub use principal::{KafkaPrincipal, PrincipalError};
pub use principal_mapping::{MappingError, PrincipalMapper};
pub use scram::{ScramClient, ScramCredential, ScramError, ScramMechanism, ScramServer};

/// A SASL mechanism a listener may offer (SaslHandshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    Plain,
    Scram(ScramMechanism),
}

impl Mechanism {
    pub const ALL: [Mechanism; 3] = [
        Mechanism::Plain,
        Mechanism::Scram(ScramMechanism::Sha256),
        Mechanism::Scram(ScramMechanism::Sha512),
    ];

    /// Its name on the wire ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512").
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Scram(m) => m.name(),
        }
    }

    /// The mechanism a client names (exact, as Kafka compares them).
    pub fn parse(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn mechanism_names_round_trip_and_are_case_sensitive() {
        for m in Mechanism::ALL {
            assert_eq!(Mechanism::parse(m.name()), Some(m));
        }
        assert_eq!(Mechanism::parse("plain"), None);
        assert_eq!(Mechanism::parse("SCRAM-SHA-1"), None);
        assert_eq!(Mechanism::parse("GSSAPI"), None);
    }
}
