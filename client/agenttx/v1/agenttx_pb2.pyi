from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StepStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_STATUS_UNSPECIFIED: _ClassVar[StepStatus]
    STEP_STATUS_SUCCESS: _ClassVar[StepStatus]
    STEP_STATUS_ROLLBACK_TRIGGERED: _ClassVar[StepStatus]
    STEP_STATUS_FAILED: _ClassVar[StepStatus]

class RollbackStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLBACK_STRATEGY_NONE: _ClassVar[RollbackStrategy]
    ROLLBACK_STRATEGY_LOCAL_BACKTRACK: _ClassVar[RollbackStrategy]
    ROLLBACK_STRATEGY_DEPENDENCY_JUMP: _ClassVar[RollbackStrategy]
    ROLLBACK_STRATEGY_GLOBAL_RESET: _ClassVar[RollbackStrategy]
    ROLLBACK_STRATEGY_MANUAL: _ClassVar[RollbackStrategy]
    ROLLBACK_STRATEGY_ABORT: _ClassVar[RollbackStrategy]

class TransactionStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSACTION_STATUS_UNSPECIFIED: _ClassVar[TransactionStatus]
    TRANSACTION_STATUS_ACTIVE: _ClassVar[TransactionStatus]
    TRANSACTION_STATUS_AWAITING_ROLLBACK: _ClassVar[TransactionStatus]
    TRANSACTION_STATUS_COMMITTED: _ClassVar[TransactionStatus]
    TRANSACTION_STATUS_ABORTED: _ClassVar[TransactionStatus]
    TRANSACTION_STATUS_EXPIRED: _ClassVar[TransactionStatus]
    TRANSACTION_STATUS_AWAITING_APPROVAL: _ClassVar[TransactionStatus]
    TRANSACTION_STATUS_REJECTED: _ClassVar[TransactionStatus]
STEP_STATUS_UNSPECIFIED: StepStatus
STEP_STATUS_SUCCESS: StepStatus
STEP_STATUS_ROLLBACK_TRIGGERED: StepStatus
STEP_STATUS_FAILED: StepStatus
ROLLBACK_STRATEGY_NONE: RollbackStrategy
ROLLBACK_STRATEGY_LOCAL_BACKTRACK: RollbackStrategy
ROLLBACK_STRATEGY_DEPENDENCY_JUMP: RollbackStrategy
ROLLBACK_STRATEGY_GLOBAL_RESET: RollbackStrategy
ROLLBACK_STRATEGY_MANUAL: RollbackStrategy
ROLLBACK_STRATEGY_ABORT: RollbackStrategy
TRANSACTION_STATUS_UNSPECIFIED: TransactionStatus
TRANSACTION_STATUS_ACTIVE: TransactionStatus
TRANSACTION_STATUS_AWAITING_ROLLBACK: TransactionStatus
TRANSACTION_STATUS_COMMITTED: TransactionStatus
TRANSACTION_STATUS_ABORTED: TransactionStatus
TRANSACTION_STATUS_EXPIRED: TransactionStatus
TRANSACTION_STATUS_AWAITING_APPROVAL: TransactionStatus
TRANSACTION_STATUS_REJECTED: TransactionStatus

class RollbackPolicy(_message.Message):
    __slots__ = ("max_local_depth", "max_global_resets", "replay_budget_factor")
    MAX_LOCAL_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_GLOBAL_RESETS_FIELD_NUMBER: _ClassVar[int]
    REPLAY_BUDGET_FACTOR_FIELD_NUMBER: _ClassVar[int]
    max_local_depth: int
    max_global_resets: int
    replay_budget_factor: float
    def __init__(self, max_local_depth: _Optional[int] = ..., max_global_resets: _Optional[int] = ..., replay_budget_factor: _Optional[float] = ...) -> None: ...

class ContextEntry(_message.Message):
    __slots__ = ("step_id", "tool_name", "raw_context")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    RAW_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    tool_name: str
    raw_context: str
    def __init__(self, step_id: _Optional[int] = ..., tool_name: _Optional[str] = ..., raw_context: _Optional[str] = ...) -> None: ...

class BeginTransactionRequest(_message.Message):
    __slots__ = ("agent_id", "metadata", "policy")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    metadata: _containers.ScalarMap[str, str]
    policy: RollbackPolicy
    def __init__(self, agent_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., policy: _Optional[_Union[RollbackPolicy, _Mapping]] = ...) -> None: ...

class BeginTransactionResponse(_message.Message):
    __slots__ = ("transaction_id", "next_step_id")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    next_step_id: int
    def __init__(self, transaction_id: _Optional[str] = ..., next_step_id: _Optional[int] = ...) -> None: ...

class ExecuteStepRequest(_message.Message):
    __slots__ = ("transaction_id", "step_id", "tool_name", "arguments_json", "raw_context")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    RAW_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    step_id: int
    tool_name: str
    arguments_json: str
    raw_context: str
    def __init__(self, transaction_id: _Optional[str] = ..., step_id: _Optional[int] = ..., tool_name: _Optional[str] = ..., arguments_json: _Optional[str] = ..., raw_context: _Optional[str] = ...) -> None: ...

class ExecuteStepResponse(_message.Message):
    __slots__ = ("status", "output_json", "clean_hint", "strategy", "rollback_to_step", "next_step_id", "constraints", "context_reset", "error_category", "rollback_latency_ms", "abort_reason", "compensation_errors")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    CLEAN_HINT_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_TO_STEP_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_RESET_FIELD_NUMBER: _ClassVar[int]
    ERROR_CATEGORY_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    ABORT_REASON_FIELD_NUMBER: _ClassVar[int]
    COMPENSATION_ERRORS_FIELD_NUMBER: _ClassVar[int]
    status: StepStatus
    output_json: str
    clean_hint: str
    strategy: RollbackStrategy
    rollback_to_step: int
    next_step_id: int
    constraints: _containers.RepeatedScalarFieldContainer[str]
    context_reset: bool
    error_category: str
    rollback_latency_ms: float
    abort_reason: str
    compensation_errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[_Union[StepStatus, str]] = ..., output_json: _Optional[str] = ..., clean_hint: _Optional[str] = ..., strategy: _Optional[_Union[RollbackStrategy, str]] = ..., rollback_to_step: _Optional[int] = ..., next_step_id: _Optional[int] = ..., constraints: _Optional[_Iterable[str]] = ..., context_reset: _Optional[bool] = ..., error_category: _Optional[str] = ..., rollback_latency_ms: _Optional[float] = ..., abort_reason: _Optional[str] = ..., compensation_errors: _Optional[_Iterable[str]] = ...) -> None: ...

class CommitTransactionRequest(_message.Message):
    __slots__ = ("transaction_id",)
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    def __init__(self, transaction_id: _Optional[str] = ...) -> None: ...

class CommitTransactionResponse(_message.Message):
    __slots__ = ("committed", "steps_committed", "effects_dispatched", "dispatch_errors", "awaiting_approval", "approval_digest")
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    STEPS_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    EFFECTS_DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_ERRORS_FIELD_NUMBER: _ClassVar[int]
    AWAITING_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_DIGEST_FIELD_NUMBER: _ClassVar[int]
    committed: bool
    steps_committed: int
    effects_dispatched: int
    dispatch_errors: _containers.RepeatedScalarFieldContainer[str]
    awaiting_approval: bool
    approval_digest: str
    def __init__(self, committed: _Optional[bool] = ..., steps_committed: _Optional[int] = ..., effects_dispatched: _Optional[int] = ..., dispatch_errors: _Optional[_Iterable[str]] = ..., awaiting_approval: _Optional[bool] = ..., approval_digest: _Optional[str] = ...) -> None: ...

class RollbackTransactionRequest(_message.Message):
    __slots__ = ("transaction_id", "to_step", "reason")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    TO_STEP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    to_step: int
    reason: str
    def __init__(self, transaction_id: _Optional[str] = ..., to_step: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class RollbackTransactionResponse(_message.Message):
    __slots__ = ("rolled_back", "next_step_id", "compensations_run", "compensation_errors")
    ROLLED_BACK_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    COMPENSATIONS_RUN_FIELD_NUMBER: _ClassVar[int]
    COMPENSATION_ERRORS_FIELD_NUMBER: _ClassVar[int]
    rolled_back: bool
    next_step_id: int
    compensations_run: int
    compensation_errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rolled_back: _Optional[bool] = ..., next_step_id: _Optional[int] = ..., compensations_run: _Optional[int] = ..., compensation_errors: _Optional[_Iterable[str]] = ...) -> None: ...

class GetTransactionRequest(_message.Message):
    __slots__ = ("transaction_id",)
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    def __init__(self, transaction_id: _Optional[str] = ...) -> None: ...

class GetTransactionResponse(_message.Message):
    __slots__ = ("transaction_id", "status", "next_step_id", "constraints", "global_resets", "context", "agent_id", "principal", "created_at", "updated_at")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_RESETS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    status: TransactionStatus
    next_step_id: int
    constraints: _containers.RepeatedScalarFieldContainer[str]
    global_resets: int
    context: _containers.RepeatedCompositeFieldContainer[ContextEntry]
    agent_id: str
    principal: str
    created_at: float
    updated_at: float
    def __init__(self, transaction_id: _Optional[str] = ..., status: _Optional[_Union[TransactionStatus, str]] = ..., next_step_id: _Optional[int] = ..., constraints: _Optional[_Iterable[str]] = ..., global_resets: _Optional[int] = ..., context: _Optional[_Iterable[_Union[ContextEntry, _Mapping]]] = ..., agent_id: _Optional[str] = ..., principal: _Optional[str] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ...) -> None: ...

class ListTransactionsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "status", "agent_id_prefix")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    status: TransactionStatus
    agent_id_prefix: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., status: _Optional[_Union[TransactionStatus, str]] = ..., agent_id_prefix: _Optional[str] = ...) -> None: ...

class TransactionSummary(_message.Message):
    __slots__ = ("transaction_id", "status", "agent_id", "principal", "next_step_id", "created_at", "updated_at")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    status: TransactionStatus
    agent_id: str
    principal: str
    next_step_id: int
    created_at: float
    updated_at: float
    def __init__(self, transaction_id: _Optional[str] = ..., status: _Optional[_Union[TransactionStatus, str]] = ..., agent_id: _Optional[str] = ..., principal: _Optional[str] = ..., next_step_id: _Optional[int] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ...) -> None: ...

class ListTransactionsResponse(_message.Message):
    __slots__ = ("transactions", "next_page_token")
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[TransactionSummary]
    next_page_token: str
    def __init__(self, transactions: _Optional[_Iterable[_Union[TransactionSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetTransactionHistoryRequest(_message.Message):
    __slots__ = ("transaction_id",)
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    def __init__(self, transaction_id: _Optional[str] = ...) -> None: ...

class HistoryStep(_message.Message):
    __slots__ = ("step_id", "tool", "status", "error_category", "clean_hint", "strategy", "at", "arguments_json", "output_json")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CATEGORY_FIELD_NUMBER: _ClassVar[int]
    CLEAN_HINT_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    tool: str
    status: StepStatus
    error_category: str
    clean_hint: str
    strategy: RollbackStrategy
    at: float
    arguments_json: str
    output_json: str
    def __init__(self, step_id: _Optional[int] = ..., tool: _Optional[str] = ..., status: _Optional[_Union[StepStatus, str]] = ..., error_category: _Optional[str] = ..., clean_hint: _Optional[str] = ..., strategy: _Optional[_Union[RollbackStrategy, str]] = ..., at: _Optional[float] = ..., arguments_json: _Optional[str] = ..., output_json: _Optional[str] = ...) -> None: ...

class TransactionHistory(_message.Message):
    __slots__ = ("transaction_id", "status", "agent_id", "principal", "created_at", "ended_at", "ended_by", "reason", "steps_committed", "effects", "steps")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEPS_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    EFFECTS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    status: TransactionStatus
    agent_id: str
    principal: str
    created_at: float
    ended_at: float
    ended_by: str
    reason: str
    steps_committed: int
    effects: int
    steps: _containers.RepeatedCompositeFieldContainer[HistoryStep]
    def __init__(self, transaction_id: _Optional[str] = ..., status: _Optional[_Union[TransactionStatus, str]] = ..., agent_id: _Optional[str] = ..., principal: _Optional[str] = ..., created_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., ended_by: _Optional[str] = ..., reason: _Optional[str] = ..., steps_committed: _Optional[int] = ..., effects: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[HistoryStep, _Mapping]]] = ...) -> None: ...

class ListToolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ToolInfo(_message.Message):
    __slots__ = ("name", "description", "input_schema_json", "kind", "toolset")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TOOLSET_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    input_schema_json: str
    kind: str
    toolset: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., kind: _Optional[str] = ..., toolset: _Optional[str] = ...) -> None: ...

class ListToolsResponse(_message.Message):
    __slots__ = ("tools",)
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[ToolInfo]
    def __init__(self, tools: _Optional[_Iterable[_Union[ToolInfo, _Mapping]]] = ...) -> None: ...

class GatedStep(_message.Message):
    __slots__ = ("step_id", "tool", "channel", "arguments_json")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    tool: str
    channel: str
    arguments_json: str
    def __init__(self, step_id: _Optional[int] = ..., tool: _Optional[str] = ..., channel: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("transaction_id", "principal", "agent_id", "digest", "gated", "write_keys", "requested_at", "expires_at")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    GATED_FIELD_NUMBER: _ClassVar[int]
    WRITE_KEYS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    principal: str
    agent_id: str
    digest: str
    gated: _containers.RepeatedCompositeFieldContainer[GatedStep]
    write_keys: _containers.RepeatedScalarFieldContainer[str]
    requested_at: float
    expires_at: float
    def __init__(self, transaction_id: _Optional[str] = ..., principal: _Optional[str] = ..., agent_id: _Optional[str] = ..., digest: _Optional[str] = ..., gated: _Optional[_Iterable[_Union[GatedStep, _Mapping]]] = ..., write_keys: _Optional[_Iterable[str]] = ..., requested_at: _Optional[float] = ..., expires_at: _Optional[float] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals", "next_page_token")
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[Approval]
    next_page_token: str
    def __init__(self, approvals: _Optional[_Iterable[_Union[Approval, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DecideApprovalRequest(_message.Message):
    __slots__ = ("transaction_id", "digest", "approve", "reason")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    APPROVE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    digest: str
    approve: bool
    reason: str
    def __init__(self, transaction_id: _Optional[str] = ..., digest: _Optional[str] = ..., approve: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class DecideApprovalResponse(_message.Message):
    __slots__ = ("status", "steps_committed", "effects_dispatched", "dispatch_errors")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STEPS_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    EFFECTS_DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_ERRORS_FIELD_NUMBER: _ClassVar[int]
    status: TransactionStatus
    steps_committed: int
    effects_dispatched: int
    dispatch_errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[_Union[TransactionStatus, str]] = ..., steps_committed: _Optional[int] = ..., effects_dispatched: _Optional[int] = ..., dispatch_errors: _Optional[_Iterable[str]] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("idempotency_key", "transaction_id", "channel", "kind", "last_error", "attempts", "dead_at", "principal")
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEAD_AT_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    idempotency_key: str
    transaction_id: str
    channel: str
    kind: str
    last_error: str
    attempts: int
    dead_at: float
    principal: str
    def __init__(self, idempotency_key: _Optional[str] = ..., transaction_id: _Optional[str] = ..., channel: _Optional[str] = ..., kind: _Optional[str] = ..., last_error: _Optional[str] = ..., attempts: _Optional[int] = ..., dead_at: _Optional[float] = ..., principal: _Optional[str] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("dead_letters", "next_page_token")
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    next_page_token: str
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeadLetterRequest(_message.Message):
    __slots__ = ("idempotency_key", "reason", "principal")
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    idempotency_key: str
    reason: str
    principal: str
    def __init__(self, idempotency_key: _Optional[str] = ..., reason: _Optional[str] = ..., principal: _Optional[str] = ...) -> None: ...

class DeadLetterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetServiceStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServiceStatus(_message.Message):
    __slots__ = ("etcd_reachable", "open_transactions", "outbox_depth", "dead_letters", "approvals_pending", "replica_id", "version", "principal", "admin")
    ETCD_REACHABLE_FIELD_NUMBER: _ClassVar[int]
    OPEN_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    OUTBOX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_PENDING_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    etcd_reachable: bool
    open_transactions: int
    outbox_depth: int
    dead_letters: int
    approvals_pending: int
    replica_id: str
    version: str
    principal: str
    admin: bool
    def __init__(self, etcd_reachable: _Optional[bool] = ..., open_transactions: _Optional[int] = ..., outbox_depth: _Optional[int] = ..., dead_letters: _Optional[int] = ..., approvals_pending: _Optional[int] = ..., replica_id: _Optional[str] = ..., version: _Optional[str] = ..., principal: _Optional[str] = ..., admin: _Optional[bool] = ...) -> None: ...
