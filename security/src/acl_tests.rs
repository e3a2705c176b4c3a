#![allow(clippy::unwrap_used)]

use super::*;
use proptest::prelude::*;
use AclOperation::*;
use ResourceType::*;

fn bind(
    rt: ResourceType,
    name: &str,
    pt: PatternType,
    who: &str,
    host: &str,
    op: AclOperation,
    perm: AclPermission,
) -> AclBinding {
    AclBinding {
        pattern: ResourcePattern {
            resource_type: rt,
            name: name.into(),
            pattern_type: pt,
        },
        entry: AccessControlEntry {
            principal: who.into(),
            host: host.into(),
            operation: op,
            permission: perm,
        },
    }
}

fn allow(rt: ResourceType, name: &str, who: &str, op: AclOperation) -> AclBinding {
    bind(
        rt,
        name,
        PatternType::Literal,
        who,
        "*",
        op,
        AclPermission::Allow,
    )
}

fn deny(rt: ResourceType, name: &str, who: &str, op: AclOperation) -> AclBinding {
    bind(
        rt,
        name,
        PatternType::Literal,
        who,
        "*",
        op,
        AclPermission::Deny,
    )
}

fn user(n: &str) -> KafkaPrincipal {
    KafkaPrincipal::user(n)
}

const HOST: &str = "10.0.0.1";

#[test]
fn enums_round_trip_codes_and_names() {
    for v in AclOperation::ALL_VALUES {
        assert_eq!(AclOperation::from_code(v.code()), Some(*v));
        assert_eq!(AclOperation::parse(v.name()), Some(*v));
    }
    for v in ResourceType::ALL_VALUES {
        assert_eq!(ResourceType::from_code(v.code()), Some(*v));
    }
    assert_eq!(
        AclOperation::parse("describe-configs"),
        Some(DescribeConfigs)
    );
    assert_eq!(
        ResourceType::parse("transactional_id"),
        Some(TransactionalId)
    );
    assert_eq!(AclOperation::from_code(0), None, "UNKNOWN is not a value");
    assert_eq!(PatternType::from_code(5), None);
    assert_eq!(AclPermission::from_code(3), Some(AclPermission::Allow));
}

#[test]
fn no_acl_follows_allow_everyone_and_super_users_pass_everything() {
    let acls = [deny(Topic, "*", "User:*", All)];
    for allow_if_none in [false, true] {
        let a = Authorizer::new(&[], Vec::new(), allow_if_none);
        assert_eq!(
            a.authorize(&user("x"), HOST, Read, Topic, "t"),
            allow_if_none
        );
        let a = Authorizer::new(&acls, vec!["User:admin".to_string()], allow_if_none);
        assert!(!a.authorize(&user("x"), HOST, Read, Topic, "t"));
        assert!(
            a.authorize(&user("admin"), HOST, Read, Topic, "t"),
            "super users ignore DENY"
        );
        assert!(a.authorize(&user("admin"), HOST, ClusterAction, Cluster, CLUSTER_NAME));
        // A group has no ACL: allow.everyone decides there.
        assert_eq!(
            a.authorize(&user("x"), HOST, Read, Group, "g"),
            allow_if_none
        );
    }
}

#[test]
fn literal_allow_grants_its_operation_and_implied_describe_only() {
    let acls = [
        allow(Topic, "t", "User:alice", Read),
        allow(Topic, "c", "User:alice", AlterConfigs),
    ];
    let a = Authorizer::new(&acls, Vec::new(), true);
    let alice = user("alice");
    assert!(a.authorize(&alice, HOST, Read, Topic, "t"));
    assert!(a.authorize(&alice, HOST, Describe, Topic, "t"));
    assert!(!a.authorize(&alice, HOST, Write, Topic, "t"));
    assert!(!a.authorize(&alice, HOST, DescribeConfigs, Topic, "t"));
    assert!(
        !a.authorize(&user("bob"), HOST, Read, Topic, "t"),
        "ACLs exist: no allow.everyone"
    );
    assert!(a.authorize(&alice, HOST, DescribeConfigs, Topic, "c"));
    assert!(!a.authorize(&alice, HOST, Describe, Topic, "c"));
    // "t" as a prefix does not make "t2" covered: no ACL there.
    assert!(a.authorize(&user("bob"), HOST, Write, Topic, "t2"));
}

#[test]
fn deny_wins_but_only_for_its_own_operation() {
    let acls = [
        allow(Topic, "*", "User:*", All),
        deny(Topic, "t", "User:alice", Write),
        deny(Topic, "t", "User:alice", Read),
    ];
    let a = Authorizer::new(&acls, Vec::new(), false);
    let alice = user("alice");
    assert!(!a.authorize(&alice, HOST, Write, Topic, "t"));
    assert!(!a.authorize(&alice, HOST, Read, Topic, "t"));
    // Kafka: a DENY of READ does not deny DESCRIBE (granted by ALL here).
    assert!(a.authorize(&alice, HOST, Describe, Topic, "t"));
    assert!(a.authorize(&alice, HOST, Write, Topic, "u"));
    assert!(a.authorize(&user("bob"), HOST, Write, Topic, "t"));
}

#[test]
fn prefixes_and_hosts_match_as_kafka_matches_them() {
    let acls = [
        bind(
            Topic,
            "logs-",
            PatternType::Prefixed,
            "User:app",
            "*",
            Write,
            AclPermission::Allow,
        ),
        bind(
            Group,
            "g",
            PatternType::Literal,
            "User:app",
            HOST,
            Read,
            AclPermission::Allow,
        ),
    ];
    let a = Authorizer::new(&acls, Vec::new(), false);
    let app = user("app");
    assert!(a.authorize(&app, HOST, Write, Topic, "logs-a"));
    assert!(a.authorize(&app, HOST, Write, Topic, "logs-"));
    assert!(!a.authorize(&app, HOST, Write, Topic, "logs"));
    assert!(!a.authorize(&app, HOST, Write, Topic, "xlogs-a"));
    assert!(a.authorize(&app, HOST, Read, Group, "g"));
    assert!(!a.authorize(&app, "10.0.0.2", Read, Group, "g"));
    // Names with multi-byte characters are cut on character boundaries.
    assert!(!a.authorize(&app, HOST, Write, Topic, "ünïcode"));
}

#[test]
fn authorize_any_follows_kip_679() {
    let a = Authorizer::new(&[allow(Topic, "a", "User:p", Write)], Vec::new(), false);
    assert!(a.authorize_any(&user("p"), HOST, Write, Topic));
    assert!(!a.authorize_any(&user("q"), HOST, Write, Topic));
    assert!(!a.authorize_any(&user("p"), HOST, Read, Topic));
    // A DENY of the whole type, or of exactly what is allowed, takes it back.
    for d in [
        deny(Topic, "*", "User:p", Write),
        deny(Topic, "a", "User:*", All),
    ] {
        let a = Authorizer::new(&[allow(Topic, "a", "User:p", Write), d], Vec::new(), false);
        assert!(!a.authorize_any(&user("p"), HOST, Write, Topic));
    }
    let denied_prefix = bind(
        Topic,
        "lo",
        PatternType::Prefixed,
        "User:p",
        "*",
        Write,
        AclPermission::Deny,
    );
    let allowed_prefix = bind(
        Topic,
        "logs",
        PatternType::Prefixed,
        "User:p",
        "*",
        Write,
        AclPermission::Allow,
    );
    let a = Authorizer::new(&[allowed_prefix.clone(), denied_prefix], Vec::new(), false);
    assert!(!a.authorize_any(&user("p"), HOST, Write, Topic));
    // A literal DENY does not cover an allowed prefix of the same name.
    let a = Authorizer::new(
        &[allowed_prefix, deny(Topic, "logs", "User:p", Write)],
        Vec::new(),
        false,
    );
    assert!(a.authorize_any(&user("p"), HOST, Write, Topic));
    // No ACL of the type at all: allow.everyone decides.
    assert!(Authorizer::new(&[], Vec::new(), true).authorize_any(&user("p"), HOST, Write, Topic));
    assert!(!Authorizer::new(&[], Vec::new(), false).authorize_any(&user("p"), HOST, Write, Topic));
}

#[test]
fn filters_match_like_describe_and_delete_acls() {
    let lit = allow(Topic, "orders", "User:a", Read);
    let wild = allow(Topic, "*", "User:b", Write);
    let pre = bind(
        Topic,
        "ord",
        PatternType::Prefixed,
        "User:a",
        HOST,
        Write,
        AclPermission::Deny,
    );
    let grp = allow(Group, "orders", "User:a", Read);
    let acls: Acls = [lit.clone(), wild.clone(), pre.clone(), grp.clone()]
        .into_iter()
        .collect();
    let run = |f: AclBindingFilter| acls.matching(&f).cloned().collect::<Vec<_>>();
    assert_eq!(run(AclBindingFilter::any()).len(), 4);
    let f = |rt, name: Option<&str>, pt| AclBindingFilter {
        resource_type: rt,
        name: name.map(str::to_string),
        pattern_type: pt,
        ..AclBindingFilter::any()
    };
    let mut m = run(f(Topic, Some("orders"), PatternType::Match));
    m.sort();
    let mut want = vec![lit.clone(), wild.clone(), pre.clone()];
    want.sort();
    assert_eq!(m, want, "MATCH: every pattern that covers the name");
    assert_eq!(
        run(f(Topic, Some("orders"), PatternType::Literal)),
        vec![lit.clone()]
    );
    assert_eq!(
        run(f(ResourceType::Any, Some("orders"), PatternType::Any)).len(),
        2
    );
    assert_eq!(
        run(f(Topic, None, PatternType::Prefixed)),
        vec![pre.clone()]
    );
    assert_eq!(
        run(f(Topic, Some("ord"), PatternType::Literal)),
        Vec::<AclBinding>::new()
    );
    let by_entry = AclBindingFilter {
        principal: Some("User:a".into()),
        operation: Write,
        ..AclBindingFilter::any()
    };
    assert_eq!(run(by_entry), vec![pre.clone()]);
    let by_perm = AclBindingFilter {
        permission: AclPermission::Deny,
        host: Some(HOST.into()),
        ..AclBindingFilter::any()
    };
    assert_eq!(run(by_perm), vec![pre]);
}

#[test]
fn validation_refuses_what_kafka_refuses() {
    let ok = allow(Topic, "t", "User:a", Read);
    assert_eq!(ok.validate(), Ok(()));
    let with = |f: &dyn Fn(&mut AclBinding)| {
        let mut b = ok.clone();
        f(&mut b);
        b.validate()
    };
    assert_eq!(
        with(&|b| b.pattern.resource_type = ResourceType::Any),
        Err(AclError::ResourceType(ResourceType::Any))
    );
    assert_eq!(
        with(&|b| b.pattern.pattern_type = PatternType::Match),
        Err(AclError::PatternType(PatternType::Match))
    );
    assert_eq!(
        with(&|b| b.entry.operation = AclOperation::Any),
        Err(AclError::Operation(AclOperation::Any))
    );
    assert_eq!(
        with(&|b| b.entry.permission = AclPermission::Any),
        Err(AclError::Permission(AclPermission::Any))
    );
    assert_eq!(with(&|b| b.pattern.name.clear()), Err(AclError::EmptyName));
    assert_eq!(with(&|b| b.entry.host.clear()), Err(AclError::EmptyHost));
    assert_eq!(
        with(&|b| b.entry.principal = "alice".into()),
        Err(AclError::Principal("alice".into()))
    );
    assert_eq!(
        with(&|b| b.entry.operation = ClusterAction),
        Err(AclError::Unsupported {
            operation: ClusterAction,
            resource_type: Topic
        })
    );
    assert_eq!(
        allow(Cluster, "other", "User:a", Alter).validate(),
        Err(AclError::ClusterName)
    );
    assert_eq!(
        allow(Cluster, CLUSTER_NAME, "User:a", Alter).validate(),
        Ok(())
    );
    assert_eq!(allow(Group, "g", "User:a", All).validate(), Ok(()));
}

/// The decision as the rules say it, by scanning every binding.
#[allow(clippy::too_many_arguments)]
fn reference(
    acls: &[AclBinding],
    supers: &[String],
    allow_if_none: bool,
    who: &KafkaPrincipal,
    host: &str,
    op: AclOperation,
    rt: ResourceType,
    name: &str,
) -> bool {
    if supers.contains(&who.to_string()) {
        return true;
    }
    let on: Vec<&AclBinding> = acls
        .iter()
        .filter(|b| b.pattern.resource_type == rt && b.pattern.covers(name))
        .collect();
    let mine = |b: &&&AclBinding| {
        (b.entry.principal == who.to_string() || b.entry.principal == "User:*")
            && (b.entry.host == host || b.entry.host == "*")
    };
    if on.iter().filter(mine).any(|b| {
        b.entry.permission == AclPermission::Deny
            && (b.entry.operation == op || b.entry.operation == All)
    }) {
        return false;
    }
    let implied: &[AclOperation] = match op {
        Describe => &[Describe, Read, Write, Delete, Alter, All],
        DescribeConfigs => &[DescribeConfigs, AlterConfigs, All],
        _ => &[op, All],
    };
    let allowed = on.iter().filter(mine).any(|b| {
        b.entry.permission == AclPermission::Allow && implied.contains(&b.entry.operation)
    });
    allowed || (on.is_empty() && allow_if_none)
}

fn arb_binding() -> impl Strategy<Value = AclBinding> {
    (
        prop::sample::select(vec![Topic, Group]),
        prop::sample::select(vec!["a", "ab", "abc", "b", "*"]),
        prop::sample::select(vec![PatternType::Literal, PatternType::Prefixed]),
        prop::sample::select(vec!["User:x", "User:y", "User:*"]),
        prop::sample::select(vec!["*", "h1", "h2"]),
        prop::sample::select(vec![
            All,
            Read,
            Write,
            Describe,
            Alter,
            AlterConfigs,
            DescribeConfigs,
        ]),
        prop::sample::select(vec![AclPermission::Allow, AclPermission::Deny]),
    )
        .prop_map(|(rt, n, pt, who, host, op, perm)| bind(rt, n, pt, who, host, op, perm))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The index decides as the reference scan over every binding.
    #[test]
    fn authorizer_agrees_with_the_rules(
        acls in prop::collection::vec(arb_binding(), 0..12),
        super_y in any::<bool>(),
        allow_if_none in any::<bool>(),
        who in prop::sample::select(vec!["x", "y", "z"]),
        host in prop::sample::select(vec!["h1", "h2"]),
        op in prop::sample::select(vec![Read, Write, Describe, Alter, AlterConfigs, DescribeConfigs]),
        rt in prop::sample::select(vec![Topic, Group]),
        name in prop::sample::select(vec!["a", "ab", "abc", "abd", "b", "c", "*"]),
    ) {
        let supers: Vec<String> = if super_y { vec!["User:y".into()] } else { Vec::new() };
        let a = Authorizer::new(&acls, supers.clone(), allow_if_none);
        let p = user(who);
        prop_assert_eq!(
            a.authorize(&p, host, op, rt, name),
            reference(&acls, &supers, allow_if_none, &p, host, op, rt, name)
        );
    }
}
