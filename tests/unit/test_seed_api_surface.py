"""Every public name of seed 001's API exists at the seed's module path (seed-api.md)."""

from __future__ import annotations

import importlib
import inspect

import pytest

SEED_NAMES = {
    "constants": "RunStatus TaskStatus NodeDisposition InputMode InputRole CorrelationMode "
    "FilterOperator SortOrder LaunchCreateStatus RUN_TERMINAL_STATUSES TASK_TERMINAL_STATUSES "
    "RUN_RETRYABLE_STATUSES MAX_OUTPUT_FIELDS_BYTES MAX_JSON_DEPTH MAX_JSON_KEYS MAX_JSON_VALUES "
    "MAX_INPUT_EDGES_PER_NODE MAX_NODE_BINDINGS MAX_NODE_BINDING_EVALUATIONS "
    "MAX_LAUNCH_BINDING_EVALUATIONS MAX_LAUNCH_BINDING_EVALUATED_BYTES MAX_FILTER_RULES_PER_EDGE "
    "MAX_FILTER_MEMBERSHIP_VALUES MAX_OUTPUT_ID_LENGTH MAX_WAIT_ID_LENGTH "
    "MAX_SNAPSHOT_OUTPUTS_PER_EDGE MAX_SNAPSHOT_OUTPUTS_PER_NODE MAX_SNAPSHOT_ROUTING_BYTES "
    "MAX_OUTPUTS_PER_TASK_COMPLETION MAX_TASK_COMPLETION_ROUTING_BYTES MAX_TASK_PLANS_PER_LAUNCH "
    "MAX_OUTPUT_REFS_PER_PLAN MAX_TASK_PLAN_BYTES MAX_RUN_INPUT_BYTES MAX_EXPRESSION_LENGTH "
    "MAX_EXPRESSION_RESULT_BYTES MAX_EXPRESSION_EVALUATION_STEPS MAX_PIPE_ARGUMENT_LENGTH "
    "MAX_PIPE_INTEGER_DIGITS MAX_SNAPSHOT_RETRIES",
    "json": "JsonScalar JsonInput JsonValue JsonWireValue FrozenDict json_string_payload_size "
    "bounded_json_size json_values_equal json_equality_key json_representations_equal "
    "freeze_json freeze_object thaw_json canonical_json_bytes routing_text",
    "models": "OutputId ExpressionError PlanningError MaterializationError EdgeSource "
    "LiteralSource RuntimeSource SecretSource ExpressionSource InputBinding FilterRule EdgeFilter "
    "Selection InputEdge DagNode NodeDefinition OutputRef output_ref_routing_size "
    "PlannedEdgeInput TaskInputPlan EmittedOutput ResolvedOutput TaskInputs PlanningSnapshot "
    "NodeLaunch LaunchCreateResult TaskContext",
    "graph": "build_slug_to_index_map resolve_dependency_indices build_children validate_graph "
    "find_root_nodes find_ready_nodes downstream_closure",
    "topology": "RunTopology",
    "filter": "apply_filter apply_selection",
    "expressions": "PipeCall PipeSpec ExpressionVocabulary Token EvaluationBudget Lookup "
    "get_expression_vocabulary tokenize_expression expression_evaluation_steps "
    "resolve_expression validate_expression extract_refs",
    "pipes": "BUILTIN_PIPES PIPE_ARITY",
    "bindings": "FieldValueCache extract_edge_field build_expression_lookup "
    "binding_evaluation_steps resolve_plan_bindings",
    "planning": "PlanConstruction resolve_correlation_mode correlation_id_for_output "
    "construct_task_plans",
    "plugins": "PluginInputMeta PluginMeta PluginLookup",
    "schema": "InputFieldSpec get_pipeline_input_schema merge_run_input "
    "validate_binding_references",
    "task_input": "resolve_task_inputs",
    "store": "StoreContractError OutputPublicationError validate_wait_id "
    "validate_output_batch_size validate_output_batch_routing_size TaskAttemptRef NodeLaunchRef "
    "TaskClaimResult TaskRecoveryResult TaskWaitResult TaskResumeResult TaskCompletionResult "
    "TaskFailureResult RunReopenResult DagStore DagWaitStore DagRetryStore OutputResolver",
    "orchestrator": "RunCallback OrchestratorCallbacks RunStartRejectedError start_run "
    "reconcile_run on_task_complete on_task_failed on_task_crashed abort_run cancel_run",
    "execution": "claim_task recover_task",
    "waiting": "wait_task resume_task",
    "retry": "RunRetryResult RetryRejectedError retry_task retry_run",
}


@pytest.mark.parametrize("module", sorted(SEED_NAMES))
def test_seed_names_exist_at_seed_paths(module: str) -> None:
    loaded = importlib.import_module(f"dagwerk.{module}")
    missing = [name for name in SEED_NAMES[module].split() if not hasattr(loaded, name)]
    assert missing == []


def test_builtin_pipes_are_the_seeds_36_in_order() -> None:
    from dagwerk.pipes import BUILTIN_PIPES

    assert list(BUILTIN_PIPES) == [
        "upper",
        "lower",
        "trim",
        "title",
        "replace",
        "strip",
        "lstrip",
        "rstrip",
        "default",
        "required",
        "first",
        "last",
        "nth",
        "join",
        "basename",
        "dirname",
        "stem",
        "ext",
        "urlencode",
        "urldecode",
        "int",
        "string",
        "truncate",
        "prepend",
        "append",
        "match",
        "json_get",
        "flatten",
        "compact",
        "pad",
        "not",
        "eq",
        "neq",
        "gt",
        "lt",
        "in",
    ]


@pytest.mark.parametrize(
    ("function", "keyword_only"),
    [
        ("dagwerk.execution.claim_task", {"expected_attempt_id", "expected_generation"}),
        ("dagwerk.execution.recover_task", {"expected_attempt_id", "expected_generation"}),
        ("dagwerk.waiting.wait_task", {"expected_attempt_id", "expected_generation"}),
        ("dagwerk.waiting.resume_task", {"expected_attempt_id", "expected_generation"}),
        ("dagwerk.orchestrator.start_run", {"callbacks"}),
        ("dagwerk.orchestrator.reconcile_run", {"callbacks"}),
        ("dagwerk.task_input.resolve_task_inputs", {"run_id", "plan"}),
        ("dagwerk.planning.construct_task_plans", {"source_indices", "snapshot"}),
    ],
)
def test_seed_keyword_only_parameters(function: str, keyword_only: set[str]) -> None:
    module, _, name = function.rpartition(".")
    signature = inspect.signature(getattr(importlib.import_module(module), name))
    kinds = {p.name: p.kind for p in signature.parameters.values()}
    for parameter in keyword_only:
        assert kinds.get(parameter) is inspect.Parameter.KEYWORD_ONLY, parameter
