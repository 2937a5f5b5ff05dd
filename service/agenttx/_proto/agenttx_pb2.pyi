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
    __slots__ = ("committed", "steps_committed", "effects_dispatched", "dispatch_errors")
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    STEPS_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    EFFECTS_DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_ERRORS_FIELD_NUMBER: _ClassVar[int]
    committed: bool
    steps_committed: int
    effects_dispatched: int
    dispatch_errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, committed: _Optional[bool] = ..., steps_committed: _Optional[int] = ..., effects_dispatched: _Optional[int] = ..., dispatch_errors: _Optional[_Iterable[str]] = ...) -> None: ...

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
