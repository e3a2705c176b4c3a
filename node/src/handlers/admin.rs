//! CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
//! IncrementalAlterConfigs and AlterConfigs (topics; and nodes' dynamic
//! configs, the replication throttles: resource name "" is the cluster
//! default, a node id that node's own).

use std::collections::BTreeMap;

use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse as LegacyAlterConfigsResourceResponse;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, CreatePartitionsRequest, CreatePartitionsResponse,
    CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    DescribeConfigsRequest, DescribeConfigsResponse, IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse, TopicName,
};
use kafka_protocol::ResponseError;
use uuid::Uuid;

use crate::kafka::str_bytes;
use crate::state::CoreState;
use crate::topics::{self, ConfigOp, CreateTopic, TopicError};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// DescribeConfigs config sources.
const SOURCE_DYNAMIC_TOPIC: i8 = 1;
const SOURCE_DYNAMIC_BROKER: i8 = 2;
const SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = 3;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;

fn topic_error(e: &TopicError) -> ResponseError {
    match e {
        TopicError::Exists(_) => ResponseError::TopicAlreadyExists,
        TopicError::Unknown(_) => ResponseError::UnknownTopicOrPartition,
        TopicError::InvalidName { .. } => ResponseError::InvalidTopicException,
        TopicError::InvalidPartitions(_) => ResponseError::InvalidPartitions,
        TopicError::InvalidReplicationFactor(_) => ResponseError::InvalidReplicationFactor,
        TopicError::InvalidConfig(_) => ResponseError::InvalidConfig,
        TopicError::Refused { code, .. } => {
            ResponseError::try_from_code(*code).unwrap_or(ResponseError::UnknownServerError)
        }
        // Retriable: the client tries again once a controller is elected.
        TopicError::Unavailable(_) => ResponseError::RequestTimedOut,
        TopicError::Engine(e) => crate::kafka::error_code(e),
    }
}

pub async fn create_topics(
    core: &CoreState,
    request: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let name = t.name.0.to_string();
        let mut configs = BTreeMap::new();
        for c in &t.configs {
            if let Some(v) = &c.value {
                configs.insert(c.name.to_string(), v.to_string());
            }
        }
        let mut create = CreateTopic {
            name: name.clone(),
            partitions: t.num_partitions,
            replication_factor: t.replication_factor,
            configs,
        };
        if !t.assignments.is_empty() {
            // Manual assignment: on one node every replica must be this node.
            let node = core.node.config.node_id;
            let ok = t
                .assignments
                .iter()
                .all(|a| a.broker_ids.len() == 1 && a.broker_ids[0].0 == node);
            if !ok {
                results.push(failed(
                    t.name,
                    &TopicError::InvalidReplicationFactor(2),
                    version,
                ));
                continue;
            }
            create.partitions = t.assignments.len() as i32;
            create.replication_factor = 1;
        }
        let outcome = if request.validate_only {
            topics::check_create(core, &create).map(|(partitions, configs)| topics::TopicInfo {
                name: name.clone(),
                id: Uuid::nil(),
                partitions,
                configs,
                assignment: Vec::new(),
            })
        } else {
            topics::create(core, create).await
        };
        results.push(match outcome {
            Ok(info) => {
                let mut r = CreatableTopicResult::default().with_name(t.name);
                if version >= 7 {
                    r.topic_id = info.id;
                }
                if version >= 5 {
                    r.num_partitions = info.partitions;
                    r.replication_factor = info
                        .assignment
                        .first()
                        .map_or(1, |a| a.replicas.len() as i16);
                    r.configs = Some(
                        effective_topic_configs(core, &info.configs)
                            .into_iter()
                            .map(|(k, v, source)| {
                                CreatableTopicConfigs::default()
                                    .with_name(str_bytes(k))
                                    .with_value(Some(str_bytes(v)))
                                    .with_config_source(source)
                            })
                            .collect(),
                    );
                }
                r
            }
            Err(e) => failed(t.name, &e, version),
        });
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// CreatePartitions: each topic grows on its own (one controller decision
/// each); a topic named twice in one request is refused, as Kafka does.
pub async fn create_partitions(
    core: &CoreState,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    let mut seen = std::collections::BTreeSet::new();
    for t in request.topics {
        let name = t.name.0.to_string();
        let outcome = if !seen.insert(name.clone()) {
            Err(TopicError::Refused {
                code: ResponseError::InvalidRequest.code(),
                message: format!("topic {name} is named twice in one request"),
            })
        } else {
            let assignments = t.assignments.map(|sets| {
                sets.into_iter()
                    .map(|a| a.broker_ids.into_iter().map(|b| b.0).collect())
                    .collect()
            });
            topics::add_partitions(core, name, t.count, assignments, request.validate_only).await
        };
        let result = CreatePartitionsTopicResult::default().with_name(t.name);
        results.push(match outcome {
            Ok(()) => result,
            Err(e) => result
                .with_error_code(topic_error(&e).code())
                .with_error_message(Some(str_bytes(e.to_string()))),
        });
    }
    CreatePartitionsResponse::default().with_results(results)
}

fn failed(name: TopicName, e: &TopicError, version: i16) -> CreatableTopicResult {
    let r = CreatableTopicResult::default()
        .with_name(name)
        .with_error_code(topic_error(e).code())
        .with_error_message(Some(str_bytes(e.to_string())));
    if version >= 5 {
        r.with_num_partitions(-1).with_replication_factor(-1)
    } else {
        r
    }
}

pub async fn delete_topics(
    core: &CoreState,
    request: DeleteTopicsRequest,
    version: i16,
) -> DeleteTopicsResponse {
    // v6 names topics by name or id; earlier versions by name.
    let targets: Vec<(Option<String>, Uuid)> = if version >= 6 {
        request
            .topics
            .into_iter()
            .map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id))
            .collect()
    } else {
        request
            .topic_names
            .into_iter()
            .map(|n| (Some(n.0.to_string()), Uuid::nil()))
            .collect()
    };
    let mut responses = Vec::with_capacity(targets.len());
    for (name, id) in targets {
        let name = name.or_else(|| core.topics().by_id(id).map(|t| t.name.clone()));
        let result = DeletableTopicResult::default();
        let Some(name) = name else {
            responses.push(result.with_error_code(ResponseError::UnknownTopicId.code()));
            continue;
        };
        let result = result.with_name(Some(TopicName(str_bytes(name.clone()))));
        let mut result = match topics::delete(core, name).await {
            Ok(info) => result.with_topic_id(info.id),
            Err(e) => {
                let r = result.with_error_code(topic_error(&e).code());
                if version >= 5 {
                    r.with_error_message(Some(str_bytes(e.to_string())))
                } else {
                    r
                }
            }
        };
        // Topic ids are in the response from v6 on.
        if version < 6 {
            result.topic_id = Uuid::nil();
        }
        responses.push(result);
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

/// Every topic config with its effective value and where it comes from.
fn effective_topic_configs(
    core: &CoreState,
    overrides: &BTreeMap<String, String>,
) -> Vec<(String, String, i8)> {
    core.node
        .config
        .topic_defaults()
        .into_iter()
        .map(|(k, default)| match overrides.get(&k) {
            Some(v) => (k, v.clone(), SOURCE_DYNAMIC_TOPIC),
            None => (k, default, SOURCE_DEFAULT),
        })
        .collect()
}

/// What an alter request may change: a topic (`None`) or a node's dynamic
/// configs (`Some`: see `broker_resource`).
fn alterable(resource_type: i8, name: &str) -> Result<Option<Option<i32>>, String> {
    match resource_type {
        RESOURCE_TOPIC => Ok(None),
        RESOURCE_BROKER => broker_resource(name).map(Some),
        _ => Err("only topic and broker configs can be altered".to_string()),
    }
}

/// A broker resource's name: "" is the cluster-wide default, else a node id.
fn broker_resource(name: &str) -> Result<Option<i32>, String> {
    if name.is_empty() {
        return Ok(None);
    }
    name.parse::<i32>()
        .ok()
        .filter(|n| *n >= 0)
        .map(Some)
        .ok_or_else(|| format!("broker resource name {name:?} is not a node id"))
}

/// The controller's own check of dynamic node config changes, run here (it
/// is a pure function) for validate-only requests.
fn check_node_configs(node: Option<i32>, ops: &[ConfigOp]) -> Result<(), TopicError> {
    let ops: Vec<(String, Option<String>)> = ops
        .iter()
        .map(|op| match op {
            ConfigOp::Set(k, v) => (k.clone(), Some(v.clone())),
            ConfigOp::Delete(k) => (k.clone(), None),
        })
        .collect();
    skiff_controller::decisions::alter_node_configs(node, &ops)
        .map(|_| ())
        .map_err(|e| TopicError::Refused {
            code: e.kafka_code(),
            message: e.to_string(),
        })
}

/// A node's configs (`None`: the cluster default): the dynamic ones (its own
/// over the cluster default), and this node's static log settings.
fn broker_configs(core: &CoreState, node: Option<i32>) -> Vec<(String, String, i8)> {
    let table = core.topics();
    let mut out: BTreeMap<String, (String, i8)> = BTreeMap::new();
    if node == Some(core.node.config.node_id) {
        for (k, v) in core.node.config.topic_defaults() {
            out.insert(format!("log.{k}"), (v, SOURCE_STATIC_BROKER));
        }
    }
    for (k, v) in &table.cluster_configs {
        out.insert(k.clone(), (v.clone(), SOURCE_DYNAMIC_DEFAULT_BROKER));
    }
    if let Some(own) = node.and_then(|n| table.node_configs.get(&n)) {
        for (k, v) in own {
            out.insert(k.clone(), (v.clone(), SOURCE_DYNAMIC_BROKER));
        }
    }
    out.into_iter().map(|(k, (v, s))| (k, v, s)).collect()
}

pub fn describe_configs(
    core: &CoreState,
    request: DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let mut results = Vec::with_capacity(request.resources.len());
    for r in request.resources {
        let result = DescribeConfigsResult::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name.clone());
        let entries: Vec<(String, String, i8)> = match r.resource_type {
            RESOURCE_TOPIC => match core.topics().get(r.resource_name.as_str()) {
                Some(info) => effective_topic_configs(core, &info.configs),
                None => {
                    results.push(
                        result
                            .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                            .with_error_message(Some(str_bytes(format!(
                                "unknown topic {}",
                                r.resource_name.as_str()
                            )))),
                    );
                    continue;
                }
            },
            RESOURCE_BROKER => match broker_resource(r.resource_name.as_str()) {
                Ok(node) => broker_configs(core, node),
                Err(message) => {
                    results.push(
                        result
                            .with_error_code(ResponseError::InvalidRequest.code())
                            .with_error_message(Some(str_bytes(message))),
                    );
                    continue;
                }
            },
            other => {
                results.push(
                    result
                        .with_error_code(ResponseError::InvalidRequest.code())
                        .with_error_message(Some(str_bytes(format!(
                            "resource type {other} is not supported"
                        )))),
                );
                continue;
            }
        };
        // Null asks for every config; so does an empty list (as Kafka's admin client means it).
        let keys: Option<Vec<String>> = r
            .configuration_keys
            .filter(|k| !k.is_empty())
            .map(|k| k.iter().map(|s| s.to_string()).collect());
        let configs = entries
            .into_iter()
            .filter(|(k, _, _)| keys.as_ref().is_none_or(|keys| keys.contains(k)))
            .map(|(k, v, source)| {
                let c = DescribeConfigsResourceResult::default()
                    .with_name(str_bytes(k))
                    .with_value(Some(str_bytes(v)))
                    .with_read_only(source == SOURCE_STATIC_BROKER);
                if version == 0 {
                    c
                } else {
                    c.with_config_source(source)
                }
            })
            .collect();
        results.push(result.with_configs(configs));
    }
    DescribeConfigsResponse::default().with_results(results)
}

pub async fn incremental_alter_configs(
    core: &CoreState,
    request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut responses = Vec::with_capacity(request.resources.len());
    for r in request.resources {
        let response = AlterConfigsResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name.clone());
        let node = match alterable(r.resource_type, r.resource_name.as_str()) {
            Ok(node) => node,
            Err(message) => {
                responses.push(
                    response
                        .with_error_code(ResponseError::InvalidRequest.code())
                        .with_error_message(Some(str_bytes(message))),
                );
                continue;
            }
        };
        let mut ops = Vec::with_capacity(r.configs.len());
        let mut refused = None;
        for c in &r.configs {
            match (c.config_operation, &c.value) {
                (0, Some(v)) => ops.push(ConfigOp::Set(c.name.to_string(), v.to_string())),
                (1, _) => ops.push(ConfigOp::Delete(c.name.to_string())),
                (op, _) => {
                    refused = Some(format!(
                        "operation {op} on {} is not supported",
                        c.name.as_str()
                    ));
                    break;
                }
            }
        }
        if let Some(message) = refused {
            responses.push(
                response
                    .with_error_code(ResponseError::InvalidRequest.code())
                    .with_error_message(Some(str_bytes(message))),
            );
            continue;
        }
        let outcome = match node {
            Some(node) if request.validate_only => check_node_configs(node, &ops),
            Some(node) => topics::alter_node_configs(core, node, ops).await,
            None => {
                topics::alter_configs(
                    core,
                    r.resource_name.to_string(),
                    ops,
                    request.validate_only,
                )
                .await
            }
        };
        responses.push(match outcome {
            Ok(()) => response,
            Err(e) => response
                .with_error_code(topic_error(&e).code())
                .with_error_message(Some(str_bytes(e.to_string()))),
        });
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

/// AlterConfigs, the legacy whole-set API (kafka-python's `alter_configs`):
/// the configs given become the topic's overrides and every other override
/// goes, as Kafka's `AlterConfigs` replaces a resource's dynamic configs. A
/// null value removes that key. Only topics; the same checks as
/// IncrementalAlterConfigs.
pub async fn alter_configs(core: &CoreState, request: AlterConfigsRequest) -> AlterConfigsResponse {
    let mut responses = Vec::with_capacity(request.resources.len());
    for r in request.resources {
        let response = LegacyAlterConfigsResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name.clone());
        let node = match alterable(r.resource_type, r.resource_name.as_str()) {
            Ok(node) => node,
            Err(message) => {
                responses.push(
                    response
                        .with_error_code(ResponseError::InvalidRequest.code())
                        .with_error_message(Some(str_bytes(message))),
                );
                continue;
            }
        };
        let name = r.resource_name.to_string();
        let current: Vec<String> = {
            let table = core.topics();
            match node {
                None => table
                    .get(&name)
                    .map(|t| t.configs.keys().cloned().collect())
                    .unwrap_or_default(),
                Some(None) => table.cluster_configs.keys().cloned().collect(),
                Some(Some(n)) => table
                    .node_configs
                    .get(&n)
                    .map(|c| c.keys().cloned().collect())
                    .unwrap_or_default(),
            }
        };
        let given: std::collections::BTreeSet<&str> =
            r.configs.iter().map(|c| c.name.as_str()).collect();
        let mut ops: Vec<ConfigOp> = r
            .configs
            .iter()
            .map(|c| match &c.value {
                Some(v) => ConfigOp::Set(c.name.to_string(), v.to_string()),
                None => ConfigOp::Delete(c.name.to_string()),
            })
            .collect();
        ops.extend(
            current
                .into_iter()
                .filter(|k| !given.contains(k.as_str()))
                .map(ConfigOp::Delete),
        );
        let outcome = match node {
            Some(node) if request.validate_only => check_node_configs(node, &ops),
            Some(node) => topics::alter_node_configs(core, node, ops).await,
            None => topics::alter_configs(core, name, ops, request.validate_only).await,
        };
        responses.push(match outcome {
            Ok(()) => response,
            Err(e) => response
                .with_error_code(topic_error(&e).code())
                .with_error_message(Some(str_bytes(e.to_string()))),
        });
    }
    AlterConfigsResponse::default().with_responses(responses)
}
