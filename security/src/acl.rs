//! Kafka's ACL model and its decisions (`StandardAuthorizer`'s rules):
//!
//! - a binding is a resource pattern (type, name, LITERAL or PREFIXED; the
//!   literal name "*" means every resource of the type) and an entry
//!   (principal or `User:*`, host or "*", operation, ALLOW or DENY);
//! - a super user may do anything;
//! - a matching DENY wins over any ALLOW;
//! - ALLOW of READ, WRITE, DELETE or ALTER implies DESCRIBE; ALLOW of
//!   ALTER_CONFIGS implies DESCRIBE_CONFIGS; ALL covers every operation;
//! - a resource no binding matches at all is allowed only with
//!   `allow.everyone.if.no.acl.found`.
//!
//! [`Acls`] is the set the metadata log holds; an [`Authorizer`] is one
//! core's index of it, rebuilt when the set changes and never shared.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::principal::KafkaPrincipal;

/// The one name of the CLUSTER resource.
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// A literal resource name, principal name or host that matches every one.
pub const WILDCARD: &str = "*";

macro_rules! kafka_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $code:literal => $text:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($variant),* }

        impl $name {
            pub const ALL_VALUES: &'static [$name] = &[$($name::$variant),*];

            /// Its code on the wire.
            pub fn code(self) -> i8 {
                match self { $($name::$variant => $code),* }
            }

            /// From a wire code; None for UNKNOWN (0) and codes Kafka does not define.
            pub fn from_code(code: i8) -> Option<Self> {
                match code { $($code => Some($name::$variant),)* _ => None }
            }

            /// Kafka's name (`kafka-acls.sh` and `skiff acl` spell it so).
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }

            /// From Kafka's name, any case, '-' or '_' alike.
            pub fn parse(s: &str) -> Option<Self> {
                let s = s.to_ascii_uppercase().replace('-', "_");
                Self::ALL_VALUES.iter().copied().find(|v| v.name() == s)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

kafka_enum!(ResourceType {
    Any = 1 => "ANY",
    Topic = 2 => "TOPIC",
    Group = 3 => "GROUP",
    Cluster = 4 => "CLUSTER",
    TransactionalId = 5 => "TRANSACTIONAL_ID",
    DelegationToken = 6 => "DELEGATION_TOKEN",
    User = 7 => "USER",
});

kafka_enum!(PatternType {
    Any = 1 => "ANY",
    Match = 2 => "MATCH",
    Literal = 3 => "LITERAL",
    Prefixed = 4 => "PREFIXED",
});

kafka_enum!(AclOperation {
    Any = 1 => "ANY",
    All = 2 => "ALL",
    Read = 3 => "READ",
    Write = 4 => "WRITE",
    Create = 5 => "CREATE",
    Delete = 6 => "DELETE",
    Alter = 7 => "ALTER",
    Describe = 8 => "DESCRIBE",
    ClusterAction = 9 => "CLUSTER_ACTION",
    DescribeConfigs = 10 => "DESCRIBE_CONFIGS",
    AlterConfigs = 11 => "ALTER_CONFIGS",
    IdempotentWrite = 12 => "IDEMPOTENT_WRITE",
    CreateTokens = 13 => "CREATE_TOKENS",
    DescribeTokens = 14 => "DESCRIBE_TOKENS",
});

kafka_enum!(AclPermission {
    Any = 1 => "ANY",
    Deny = 2 => "DENY",
    Allow = 3 => "ALLOW",
});

impl ResourceType {
    /// The operations an ACL may name on this resource type (besides ALL),
    /// as Kafka's `AclEntry.supportedOperations` lists them.
    pub fn operations(self) -> &'static [AclOperation] {
        use AclOperation::*;
        match self {
            ResourceType::Topic => &[
                Read,
                Write,
                Create,
                Describe,
                Delete,
                Alter,
                DescribeConfigs,
                AlterConfigs,
            ],
            ResourceType::Group => &[Read, Describe, Delete],
            ResourceType::Cluster => &[
                Create,
                ClusterAction,
                DescribeConfigs,
                AlterConfigs,
                IdempotentWrite,
                Alter,
                Describe,
            ],
            ResourceType::TransactionalId => &[Describe, Write],
            ResourceType::DelegationToken => &[Describe],
            ResourceType::User => &[CreateTokens, DescribeTokens],
            ResourceType::Any => &[],
        }
    }
}

impl AclOperation {
    /// The ALLOW operations that grant this one.
    fn granted_by(self) -> &'static [AclOperation] {
        use AclOperation::*;
        match self {
            Describe => &[All, Describe, Read, Write, Delete, Alter],
            DescribeConfigs => &[All, DescribeConfigs, AlterConfigs],
            Read => &[All, Read],
            Write => &[All, Write],
            Create => &[All, Create],
            Delete => &[All, Delete],
            Alter => &[All, Alter],
            ClusterAction => &[All, ClusterAction],
            AlterConfigs => &[All, AlterConfigs],
            IdempotentWrite => &[All, IdempotentWrite],
            CreateTokens => &[All, CreateTokens],
            DescribeTokens => &[All, DescribeTokens],
            All => &[All],
            Any => &[],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourcePattern {
    pub resource_type: ResourceType,
    pub name: String,
    /// LITERAL or PREFIXED.
    pub pattern_type: PatternType,
}

impl ResourcePattern {
    pub fn literal(resource_type: ResourceType, name: impl Into<String>) -> Self {
        ResourcePattern {
            resource_type,
            name: name.into(),
            pattern_type: PatternType::Literal,
        }
    }

    pub fn prefixed(resource_type: ResourceType, name: impl Into<String>) -> Self {
        ResourcePattern {
            resource_type,
            name: name.into(),
            pattern_type: PatternType::Prefixed,
        }
    }

    /// Whether this pattern covers the resource `name` of its type.
    pub fn covers(&self, name: &str) -> bool {
        match self.pattern_type {
            PatternType::Literal => self.name == name || self.name == WILDCARD,
            PatternType::Prefixed => name.starts_with(&self.name),
            PatternType::Any | PatternType::Match => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AccessControlEntry {
    /// "User:alice", or "User:*" for every user.
    pub principal: String,
    /// An IP address as the client connects from, or "*".
    pub host: String,
    pub operation: AclOperation,
    /// ALLOW or DENY.
    pub permission: AclPermission,
}

impl AccessControlEntry {
    fn applies_to(&self, principal: &str, host: &str) -> bool {
        (self.principal == principal || self.principal == "User:*")
            && (self.host == host || self.host == WILDCARD)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AclBinding {
    pub pattern: ResourcePattern,
    pub entry: AccessControlEntry,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    #[error("the resource type of an ACL must be a concrete type, not {0}")]
    ResourceType(ResourceType),
    #[error("the pattern type of an ACL must be LITERAL or PREFIXED, not {0}")]
    PatternType(PatternType),
    #[error("the operation of an ACL must be concrete, not {0}")]
    Operation(AclOperation),
    #[error("the permission of an ACL must be ALLOW or DENY, not {0}")]
    Permission(AclPermission),
    #[error("an ACL needs a resource name")]
    EmptyName,
    #[error("the only valid name for the CLUSTER resource is kafka-cluster")]
    ClusterName,
    #[error("operation {operation} does not apply to resource type {resource_type}")]
    Unsupported {
        operation: AclOperation,
        resource_type: ResourceType,
    },
    #[error("principal {0:?} is not of the form type:name (for example User:alice)")]
    Principal(String),
    #[error("an ACL needs a host (an IP address or *)")]
    EmptyHost,
    #[error("unknown {what} code {code}")]
    UnknownCode { what: &'static str, code: i8 },
}

impl AclBinding {
    /// What CreateAcls accepts (Kafka's checks; the error is the message
    /// INVALID_REQUEST carries).
    pub fn validate(&self) -> Result<(), AclError> {
        let p = &self.pattern;
        let e = &self.entry;
        if p.resource_type == ResourceType::Any {
            return Err(AclError::ResourceType(p.resource_type));
        }
        if !matches!(p.pattern_type, PatternType::Literal | PatternType::Prefixed) {
            return Err(AclError::PatternType(p.pattern_type));
        }
        if e.operation == AclOperation::Any {
            return Err(AclError::Operation(e.operation));
        }
        if e.permission == AclPermission::Any {
            return Err(AclError::Permission(e.permission));
        }
        if p.name.is_empty() {
            return Err(AclError::EmptyName);
        }
        if p.resource_type == ResourceType::Cluster
            && (p.name != CLUSTER_NAME || p.pattern_type != PatternType::Literal)
        {
            return Err(AclError::ClusterName);
        }
        if e.operation != AclOperation::All && !p.resource_type.operations().contains(&e.operation)
        {
            return Err(AclError::Unsupported {
                operation: e.operation,
                resource_type: p.resource_type,
            });
        }
        KafkaPrincipal::parse(&e.principal)
            .map_err(|_| AclError::Principal(e.principal.clone()))?;
        if e.host.is_empty() {
            return Err(AclError::EmptyHost);
        }
        Ok(())
    }
}

/// DescribeAcls' and DeleteAcls' filter: `None` and ANY match everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclBindingFilter {
    pub resource_type: ResourceType,
    pub name: Option<String>,
    /// ANY, MATCH (every pattern that covers `name`), LITERAL or PREFIXED.
    pub pattern_type: PatternType,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: AclOperation,
    pub permission: AclPermission,
}

impl AclBindingFilter {
    /// Matches every binding.
    pub fn any() -> Self {
        AclBindingFilter {
            resource_type: ResourceType::Any,
            name: None,
            pattern_type: PatternType::Any,
            principal: None,
            host: None,
            operation: AclOperation::Any,
            permission: AclPermission::Any,
        }
    }

    pub fn matches(&self, b: &AclBinding) -> bool {
        let p = &b.pattern;
        let e = &b.entry;
        let pattern = match (self.pattern_type, &self.name) {
            (PatternType::Any, name) => name.as_ref().is_none_or(|n| *n == p.name),
            (PatternType::Match, None) => true,
            (PatternType::Match, Some(n)) => p.covers(n),
            (t, name) => t == p.pattern_type && name.as_ref().is_none_or(|n| *n == p.name),
        };
        (self.resource_type == ResourceType::Any || self.resource_type == p.resource_type)
            && pattern
            && self.principal.as_ref().is_none_or(|x| *x == e.principal)
            && self.host.as_ref().is_none_or(|x| *x == e.host)
            && (self.operation == AclOperation::Any || self.operation == e.operation)
            && (self.permission == AclPermission::Any || self.permission == e.permission)
    }
}

/// The cluster's ACLs (what the metadata log holds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acls {
    bindings: BTreeSet<AclBinding>,
}

impl Acls {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a binding; false if it was there already.
    pub fn add(&mut self, b: AclBinding) -> bool {
        self.bindings.insert(b)
    }

    pub fn remove(&mut self, b: &AclBinding) -> bool {
        self.bindings.remove(b)
    }

    /// The bindings `filter` matches, in a stable order.
    pub fn matching<'a>(
        &'a self,
        filter: &'a AclBindingFilter,
    ) -> impl Iterator<Item = &'a AclBinding> + 'a {
        self.bindings.iter().filter(move |b| filter.matches(b))
    }

    pub fn iter(&self) -> impl Iterator<Item = &AclBinding> {
        self.bindings.iter()
    }

    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }
}

impl FromIterator<AclBinding> for Acls {
    fn from_iter<I: IntoIterator<Item = AclBinding>>(iter: I) -> Self {
        Acls {
            bindings: iter.into_iter().collect(),
        }
    }
}

/// One core's index of the ACLs, for decisions on its connections.
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    /// type -> literal name (or "*") -> entries.
    literal: HashMap<ResourceType, HashMap<String, Vec<AccessControlEntry>>>,
    /// type -> prefix -> entries.
    prefixed: HashMap<ResourceType, HashMap<String, Vec<AccessControlEntry>>>,
    /// Every pattern per type (for decisions over a whole type).
    by_type: HashMap<ResourceType, Vec<AclBinding>>,
    super_users: HashSet<String>,
    allow_if_no_acl: bool,
}

impl Authorizer {
    /// `super_users`: principals ("User:admin") allowed everything;
    /// `allow_if_no_acl`: Kafka's `allow.everyone.if.no.acl.found`.
    pub fn new<'a>(
        acls: impl IntoIterator<Item = &'a AclBinding>,
        super_users: impl IntoIterator<Item = String>,
        allow_if_no_acl: bool,
    ) -> Self {
        let mut a = Authorizer {
            super_users: super_users.into_iter().collect(),
            allow_if_no_acl,
            ..Default::default()
        };
        for b in acls {
            let index = match b.pattern.pattern_type {
                PatternType::Literal => &mut a.literal,
                PatternType::Prefixed => &mut a.prefixed,
                PatternType::Any | PatternType::Match => continue,
            };
            index
                .entry(b.pattern.resource_type)
                .or_default()
                .entry(b.pattern.name.clone())
                .or_default()
                .push(b.entry.clone());
            a.by_type
                .entry(b.pattern.resource_type)
                .or_default()
                .push(b.clone());
        }
        a
    }

    pub fn is_super_user(&self, principal: &KafkaPrincipal) -> bool {
        self.super_users.contains(&principal.to_string())
    }

    /// The entries of every pattern that covers `name`.
    fn entries<'a>(
        &'a self,
        resource_type: ResourceType,
        name: &'a str,
    ) -> impl Iterator<Item = &'a AccessControlEntry> + 'a {
        let literal = self.literal.get(&resource_type);
        let prefixed = self.prefixed.get(&resource_type);
        let wildcard = (name != WILDCARD).then_some(WILDCARD);
        let literal = std::iter::once(name)
            .chain(wildcard)
            .filter_map(move |n| literal?.get(n))
            .flatten();
        let prefixed = name
            .char_indices()
            .map(|(i, c)| &name[..i + c.len_utf8()])
            .filter_map(move |p| prefixed?.get(p))
            .flatten();
        literal.chain(prefixed)
    }

    /// May `principal`, connected from `host`, do `op` on the resource?
    pub fn authorize(
        &self,
        principal: &KafkaPrincipal,
        host: &str,
        op: AclOperation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        if self.is_super_user(principal) {
            return true;
        }
        let who = principal.to_string();
        let mut any = false;
        let mut allowed = false;
        for e in self.entries(resource_type, name) {
            any = true;
            if !e.applies_to(&who, host) {
                continue;
            }
            match e.permission {
                AclPermission::Deny if e.operation == op || e.operation == AclOperation::All => {
                    return false;
                }
                AclPermission::Allow if op.granted_by().contains(&e.operation) => allowed = true,
                _ => {}
            }
        }
        allowed || (!any && self.allow_if_no_acl)
    }

    /// May `principal` do `op` on at least one resource of the type (Kafka's
    /// `authorizeByResourceType`, KIP-679: an idempotent producer needs WRITE
    /// on some topic)? An ALLOW counts unless a DENY covers all it allows.
    pub fn authorize_any(
        &self,
        principal: &KafkaPrincipal,
        host: &str,
        op: AclOperation,
        resource_type: ResourceType,
    ) -> bool {
        // Super users, and a type without ACLs under allow.everyone.
        if self.authorize(principal, host, op, resource_type, "hardcode") {
            return true;
        }
        let who = principal.to_string();
        let Some(bindings) = self.by_type.get(&resource_type) else {
            return false;
        };
        let applies = |b: &&AclBinding| b.entry.applies_to(&who, host);
        let denies: Vec<&ResourcePattern> = bindings
            .iter()
            .filter(applies)
            .filter(|b| {
                b.entry.permission == AclPermission::Deny
                    && (b.entry.operation == op || b.entry.operation == AclOperation::All)
            })
            .map(|b| &b.pattern)
            .collect();
        if denies
            .iter()
            .any(|d| d.pattern_type == PatternType::Literal && d.name == WILDCARD)
        {
            return false;
        }
        let denied = |allow: &ResourcePattern| {
            denies.iter().any(|d| match d.pattern_type {
                // A denied prefix covers every name and prefix it starts.
                PatternType::Prefixed => allow.name.starts_with(&d.name),
                _ => allow.pattern_type == PatternType::Literal && d.name == allow.name,
            })
        };
        bindings
            .iter()
            .filter(applies)
            .filter(|b| {
                b.entry.permission == AclPermission::Allow
                    && op.granted_by().contains(&b.entry.operation)
            })
            .any(|b| !denied(&b.pattern))
    }
}

#[cfg(test)]
#[path = "acl_tests.rs"]
mod tests;
