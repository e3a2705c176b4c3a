//! Who a connection is: Kafka's `KafkaPrincipal`, "type:name".

use std::fmt;

/// The principal type of every SASL and TLS identity.
pub const USER_TYPE: &str = "User";

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KafkaPrincipal {
    pub principal_type: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrincipalError {
    #[error("principal {0:?} is not of the form type:name (for example User:alice)")]
    Malformed(String),
}

impl KafkaPrincipal {
    /// `User:name`.
    pub fn user(name: impl Into<String>) -> Self {
        KafkaPrincipal {
            principal_type: USER_TYPE.to_string(),
            name: name.into(),
        }
    }

    /// A connection that did not authenticate (PLAINTEXT, SSL without a
    /// client certificate).
    pub fn anonymous() -> Self {
        Self::user("ANONYMOUS")
    }

    /// `User:*`, which an ACL names to mean every user.
    pub fn wildcard() -> Self {
        Self::user("*")
    }

    /// Parses "type:name"; the name may itself hold colons (a certificate's
    /// distinguished name never does, a SASL name might).
    pub fn parse(s: &str) -> Result<Self, PrincipalError> {
        match s.split_once(':') {
            Some((t, n)) if !t.is_empty() && !n.is_empty() => Ok(KafkaPrincipal {
                principal_type: t.to_string(),
                name: n.to_string(),
            }),
            _ => Err(PrincipalError::Malformed(s.to_string())),
        }
    }

    pub fn is_wildcard(&self) -> bool {
        self.principal_type == USER_TYPE && self.name == "*"
    }
}

impl fmt::Display for KafkaPrincipal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.principal_type, self.name)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_type_and_name() {
        let p = KafkaPrincipal::parse("User:alice").unwrap();
        assert_eq!(p, KafkaPrincipal::user("alice"));
        assert_eq!(p.to_string(), "User:alice");
        let dn = KafkaPrincipal::parse("User:CN=node1,OU=skiff").unwrap();
        assert_eq!(dn.name, "CN=node1,OU=skiff");
        assert_eq!(KafkaPrincipal::parse("User:a:b").unwrap().name, "a:b");
        assert!(KafkaPrincipal::parse("User:*").unwrap().is_wildcard());
        assert!(!KafkaPrincipal::parse("Group:*").unwrap().is_wildcard());
    }

    #[test]
    fn refuses_what_is_not_type_colon_name() {
        for bad in ["alice", "User:", ":alice", ""] {
            assert_eq!(
                KafkaPrincipal::parse(bad),
                Err(PrincipalError::Malformed(bad.to_string()))
            );
        }
    }
}
