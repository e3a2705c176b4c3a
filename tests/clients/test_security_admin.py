"""ACLs and SCRAM credentials through confluent-kafka's AdminClient (issue 17):
CreateAcls, DescribeAcls, DeleteAcls, AlterUserScramCredentials and
DescribeUserScramCredentials, their errors, and both kinds of metadata after a
restart (they live in the metadata log)."""

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType,
                                  ResourceType, ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
                                  UserScramCredentialUpsertion)

import ck

T = ck.REQUEST_TIMEOUT_S


def binding(name, principal, op=AclOperation.READ, pattern=ResourcePatternType.LITERAL,
            rtype=ResourceType.TOPIC, permission=AclPermissionType.ALLOW, host="*"):
    return AclBinding(rtype, name, pattern, principal, host, op, permission)


def any_filter(**kw):
    f = dict(restype=ResourceType.ANY, name=None, resource_pattern_type=ResourcePatternType.ANY,
             principal=None, host=None, operation=AclOperation.ANY, permission_type=AclPermissionType.ANY)
    f.update(kw)
    return AclBindingFilter(f["restype"], f["name"], f["resource_pattern_type"], f["principal"], f["host"],
                            f["operation"], f["permission_type"])


def describe(a, f):
    return sorted(a.describe_acls(f, request_timeout=T).result(timeout=T), key=str)


def code(exc):
    err = exc.args[0]
    return err.code() if isinstance(err, KafkaError) else err


def test_acls_are_created_described_and_deleted(node_factory):
    n = node_factory()
    a = ck.admin(n.bootstrap)
    orders = binding("orders", "User:alice")
    prefix = binding("ord", "User:bob", AclOperation.WRITE, ResourcePatternType.PREFIXED)
    group = binding("g1", "User:alice", rtype=ResourceType.GROUP)
    for fut in a.create_acls([orders, prefix, group], request_timeout=T).values():
        assert fut.result(timeout=T) is None
    assert describe(a, any_filter()) == sorted([orders, prefix, group], key=str)
    # MATCH: the literal binding and the prefix that covers "orders".
    match = any_filter(restype=ResourceType.TOPIC, name="orders", resource_pattern_type=ResourcePatternType.MATCH)
    assert describe(a, match) == sorted([orders, prefix], key=str)
    assert describe(a, any_filter(principal="User:bob")) == [prefix]

    # Kafka refuses what means nothing: a CLUSTER resource not named
    # kafka-cluster, an operation that does not apply to the resource type.
    bad = [binding("other", "User:alice", AclOperation.ALTER, rtype=ResourceType.BROKER),
           binding("orders", "User:alice", AclOperation.CLUSTER_ACTION)]
    for b, fut in a.create_acls(bad, request_timeout=T).items():
        with pytest.raises(KafkaException) as e:
            fut.result(timeout=T)
        assert code(e.value) == KafkaError.INVALID_REQUEST, b

    deleted = a.delete_acls([any_filter(restype=ResourceType.TOPIC)], request_timeout=T)
    removed = list(deleted.values())[0].result(timeout=T)
    assert sorted(removed, key=str) == sorted([orders, prefix], key=str)
    assert describe(a, any_filter()) == [group]

    # They are metadata: a restart keeps them.
    n.restart()
    a = ck.admin(n.bootstrap)
    assert describe(a, any_filter()) == [group]


def test_scram_credentials_are_set_described_and_deleted(node_factory):
    n = node_factory()
    a = ck.admin(n.bootstrap)
    fs = a.alter_user_scram_credentials([
        UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"pw1"),
        UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"pw1"),
        UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"pw2"),
    ], request_timeout=T)
    for user, fut in fs.items():
        assert fut.result(timeout=T) is None, user

    described = a.describe_user_scram_credentials(request_timeout=T).result(timeout=T)
    assert sorted(described) == ["alice", "bob"]
    infos = {(i.mechanism, i.iterations) for i in described["alice"].scram_credential_infos}
    assert infos == {(ScramMechanism.SCRAM_SHA_512, 8192), (ScramMechanism.SCRAM_SHA_256, 4096)}

    # Kafka's refusals: too few iterations, deleting what does not exist,
    # describing an unknown user.
    fs = a.alter_user_scram_credentials([
        UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"pw"),
        UserScramCredentialDeletion("dave", ScramMechanism.SCRAM_SHA_256),
    ], request_timeout=T)
    expected = {"carol": KafkaError.UNACCEPTABLE_CREDENTIAL, "dave": KafkaError.RESOURCE_NOT_FOUND}
    for user, fut in fs.items():
        with pytest.raises(KafkaException) as e:
            fut.result(timeout=T)
        assert code(e.value) == expected[user], user
    futs = a.describe_user_scram_credentials(["erin"], request_timeout=T)
    with pytest.raises(KafkaException) as e:
        futs["erin"].result(timeout=T)
    assert code(e.value) == KafkaError.RESOURCE_NOT_FOUND

    fs = a.alter_user_scram_credentials([UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_256)],
                                        request_timeout=T)
    fs["bob"].result(timeout=T)
    n.restart()
    a = ck.admin(n.bootstrap)
    described = a.describe_user_scram_credentials(request_timeout=T).result(timeout=T)
    assert sorted(described) == ["alice"], "bob's only credential is gone, alice's survive the restart"
