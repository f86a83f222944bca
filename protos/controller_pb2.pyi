from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    RUNNING: _ClassVar[JobState]
    COMPLETED: _ClassVar[JobState]
    FAILED: _ClassVar[JobState]
JOB_STATE_UNSPECIFIED: JobState
RUNNING: JobState
COMPLETED: JobState
FAILED: JobState

class QuorumRequest(_message.Message):
    __slots__ = ("job_id", "replica_id", "step", "world_size", "ftar_addresses", "state_addresses", "known_quorum_id", "leader_address", "incarnation", "host_id", "checkpoint_every_steps", "credential")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    FTAR_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    STATE_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    KNOWN_QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_STEPS_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    replica_id: str
    step: int
    world_size: int
    ftar_addresses: _containers.RepeatedScalarFieldContainer[str]
    state_addresses: _containers.RepeatedScalarFieldContainer[str]
    known_quorum_id: int
    leader_address: str
    incarnation: str
    host_id: str
    checkpoint_every_steps: int
    credential: str
    def __init__(self, job_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., step: _Optional[int] = ..., world_size: _Optional[int] = ..., ftar_addresses: _Optional[_Iterable[str]] = ..., state_addresses: _Optional[_Iterable[str]] = ..., known_quorum_id: _Optional[int] = ..., leader_address: _Optional[str] = ..., incarnation: _Optional[str] = ..., host_id: _Optional[str] = ..., checkpoint_every_steps: _Optional[int] = ..., credential: _Optional[str] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("replica_id", "step", "healthy", "ftar_addresses", "state_addresses")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    FTAR_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    STATE_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    step: int
    healthy: bool
    ftar_addresses: _containers.RepeatedScalarFieldContainer[str]
    state_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica_id: _Optional[str] = ..., step: _Optional[int] = ..., healthy: _Optional[bool] = ..., ftar_addresses: _Optional[_Iterable[str]] = ..., state_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class RecoverAssignment(_message.Message):
    __slots__ = ("replica_id", "sources_by_shard")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCES_BY_SHARD_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    sources_by_shard: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica_id: _Optional[str] = ..., sources_by_shard: _Optional[_Iterable[str]] = ...) -> None: ...

class QuorumResponse(_message.Message):
    __slots__ = ("quorum_id", "members", "max_step", "recover", "lr_scale", "reason", "addresses_included", "total_replicas", "resume_checkpoint_step", "quorum_address", "sync_mode", "sync_every_steps", "sync_fragments")
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    MAX_STEP_FIELD_NUMBER: _ClassVar[int]
    RECOVER_FIELD_NUMBER: _ClassVar[int]
    LR_SCALE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_INCLUDED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    RESUME_CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SYNC_MODE_FIELD_NUMBER: _ClassVar[int]
    SYNC_EVERY_STEPS_FIELD_NUMBER: _ClassVar[int]
    SYNC_FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    quorum_id: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    max_step: int
    recover: _containers.RepeatedCompositeFieldContainer[RecoverAssignment]
    lr_scale: float
    reason: str
    addresses_included: bool
    total_replicas: int
    resume_checkpoint_step: int
    quorum_address: str
    sync_mode: str
    sync_every_steps: int
    sync_fragments: int
    def __init__(self, quorum_id: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., max_step: _Optional[int] = ..., recover: _Optional[_Iterable[_Union[RecoverAssignment, _Mapping]]] = ..., lr_scale: _Optional[float] = ..., reason: _Optional[str] = ..., addresses_included: _Optional[bool] = ..., total_replicas: _Optional[int] = ..., resume_checkpoint_step: _Optional[int] = ..., quorum_address: _Optional[str] = ..., sync_mode: _Optional[str] = ..., sync_every_steps: _Optional[int] = ..., sync_fragments: _Optional[int] = ...) -> None: ...

class QuorumPortRefusal(_message.Message):
    __slots__ = ("code", "details", "leader_address")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    code: str
    details: str
    leader_address: str
    def __init__(self, code: _Optional[str] = ..., details: _Optional[str] = ..., leader_address: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("host_ids", "replica_ids", "agent_secret", "credential", "host_id", "finishing_trainers")
    HOST_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    AGENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    FINISHING_TRAINERS_FIELD_NUMBER: _ClassVar[int]
    host_ids: _containers.RepeatedScalarFieldContainer[str]
    replica_ids: _containers.RepeatedScalarFieldContainer[str]
    agent_secret: str
    credential: str
    host_id: str
    finishing_trainers: int
    def __init__(self, host_ids: _Optional[_Iterable[str]] = ..., replica_ids: _Optional[_Iterable[str]] = ..., agent_secret: _Optional[str] = ..., credential: _Optional[str] = ..., host_id: _Optional[str] = ..., finishing_trainers: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("unknown_ids", "not_leader", "job_state", "leader_address", "job_state_reason")
    UNKNOWN_IDS_FIELD_NUMBER: _ClassVar[int]
    NOT_LEADER_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_REASON_FIELD_NUMBER: _ClassVar[int]
    unknown_ids: _containers.RepeatedScalarFieldContainer[str]
    not_leader: bool
    job_state: JobState
    leader_address: str
    job_state_reason: str
    def __init__(self, unknown_ids: _Optional[_Iterable[str]] = ..., not_leader: _Optional[bool] = ..., job_state: _Optional[_Union[JobState, str]] = ..., leader_address: _Optional[str] = ..., job_state_reason: _Optional[str] = ...) -> None: ...

class ReportStepRequest(_message.Message):
    __slots__ = ("job_id", "replica_id", "quorum_id", "step", "step_time_s", "loss", "tokens", "host_id", "digest", "caught_up", "checkpoint_step", "rank_digests", "credential")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    replica_id: str
    quorum_id: int
    step: int
    step_time_s: float
    loss: float
    tokens: int
    host_id: str
    digest: str
    caught_up: bool
    checkpoint_step: int
    rank_digests: _containers.RepeatedScalarFieldContainer[str]
    credential: str
    def __init__(self, job_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., quorum_id: _Optional[int] = ..., step: _Optional[int] = ..., step_time_s: _Optional[float] = ..., loss: _Optional[float] = ..., tokens: _Optional[int] = ..., host_id: _Optional[str] = ..., digest: _Optional[str] = ..., caught_up: _Optional[bool] = ..., checkpoint_step: _Optional[int] = ..., rank_digests: _Optional[_Iterable[str]] = ..., credential: _Optional[str] = ...) -> None: ...

class ReportStepResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportFinishedRequest(_message.Message):
    __slots__ = ("job_id", "replica_id", "step", "host_id", "reason", "credential")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    replica_id: str
    step: int
    host_id: str
    reason: str
    credential: str
    def __init__(self, job_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., step: _Optional[int] = ..., host_id: _Optional[str] = ..., reason: _Optional[str] = ..., credential: _Optional[str] = ...) -> None: ...

class ReportFinishedResponse(_message.Message):
    __slots__ = ("job_state",)
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    job_state: JobState
    def __init__(self, job_state: _Optional[_Union[JobState, str]] = ...) -> None: ...

class ReportFailureRequest(_message.Message):
    __slots__ = ("job_id", "replica_id", "quorum_id", "step", "kind", "reason", "host_id", "credential")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[ReportFailureRequest.Kind]
        COMMIT_FAILED: _ClassVar[ReportFailureRequest.Kind]
        REPLICA_DEAD: _ClassVar[ReportFailureRequest.Kind]
    KIND_UNSPECIFIED: ReportFailureRequest.Kind
    COMMIT_FAILED: ReportFailureRequest.Kind
    REPLICA_DEAD: ReportFailureRequest.Kind
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    replica_id: str
    quorum_id: int
    step: int
    kind: ReportFailureRequest.Kind
    reason: str
    host_id: str
    credential: str
    def __init__(self, job_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., quorum_id: _Optional[int] = ..., step: _Optional[int] = ..., kind: _Optional[_Union[ReportFailureRequest.Kind, str]] = ..., reason: _Optional[str] = ..., host_id: _Optional[str] = ..., credential: _Optional[str] = ...) -> None: ...

class ReportFailureResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("replica_id", "ranks", "world_size", "version", "replica_version", "rendezvous_address", "coordinator_address")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_VERSION_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    world_size: int
    version: int
    replica_version: int
    rendezvous_address: str
    coordinator_address: str
    def __init__(self, replica_id: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., world_size: _Optional[int] = ..., version: _Optional[int] = ..., replica_version: _Optional[int] = ..., rendezvous_address: _Optional[str] = ..., coordinator_address: _Optional[str] = ...) -> None: ...

class RegisterAgentRequest(_message.Message):
    __slots__ = ("host_id", "spare", "slots", "labels", "assignment", "incarnation", "address", "rendezvous_port", "coordinator_port", "previous_secret", "proof", "standby")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    SPARE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_PORT_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_PORT_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_SECRET_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    spare: bool
    slots: int
    labels: _containers.ScalarMap[str, str]
    assignment: Assignment
    incarnation: str
    address: str
    rendezvous_port: int
    coordinator_port: int
    previous_secret: str
    proof: str
    standby: bool
    def __init__(self, host_id: _Optional[str] = ..., spare: _Optional[bool] = ..., slots: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., incarnation: _Optional[str] = ..., address: _Optional[str] = ..., rendezvous_port: _Optional[int] = ..., coordinator_port: _Optional[int] = ..., previous_secret: _Optional[str] = ..., proof: _Optional[str] = ..., standby: _Optional[bool] = ...) -> None: ...

class RegisterAgentResponse(_message.Message):
    __slots__ = ("assignment", "reason", "job_id", "job_state", "agent_secret", "job_state_reason")
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    AGENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_REASON_FIELD_NUMBER: _ClassVar[int]
    assignment: Assignment
    reason: str
    job_id: str
    job_state: JobState
    agent_secret: str
    job_state_reason: str
    def __init__(self, assignment: _Optional[_Union[Assignment, _Mapping]] = ..., reason: _Optional[str] = ..., job_id: _Optional[str] = ..., job_state: _Optional[_Union[JobState, str]] = ..., agent_secret: _Optional[str] = ..., job_state_reason: _Optional[str] = ...) -> None: ...

class DeregisterAgentRequest(_message.Message):
    __slots__ = ("host_id", "incarnation", "agent_secret", "reason")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    AGENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    incarnation: str
    agent_secret: str
    reason: str
    def __init__(self, host_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., agent_secret: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DeregisterAgentResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OrdersRequest(_message.Message):
    __slots__ = ("host_id", "incarnation", "agent_secret")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    AGENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    incarnation: str
    agent_secret: str
    def __init__(self, host_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., agent_secret: _Optional[str] = ...) -> None: ...

class Order(_message.Message):
    __slots__ = ("order_id", "kind", "assignment", "reason", "version")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Order.Kind]
        START: _ClassVar[Order.Kind]
        RESTART: _ClassVar[Order.Kind]
        STOP: _ClassVar[Order.Kind]
        ASSIGN: _ClassVar[Order.Kind]
        RELEASE: _ClassVar[Order.Kind]
        CURRENT: _ClassVar[Order.Kind]
    KIND_UNSPECIFIED: Order.Kind
    START: Order.Kind
    RESTART: Order.Kind
    STOP: Order.Kind
    ASSIGN: Order.Kind
    RELEASE: Order.Kind
    CURRENT: Order.Kind
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    order_id: str
    kind: Order.Kind
    assignment: Assignment
    reason: str
    version: int
    def __init__(self, order_id: _Optional[str] = ..., kind: _Optional[_Union[Order.Kind, str]] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., reason: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class AckOrderRequest(_message.Message):
    __slots__ = ("host_id", "order_id", "ok", "error", "agent_secret")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    AGENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    order_id: str
    ok: bool
    error: str
    agent_secret: str
    def __init__(self, host_id: _Optional[str] = ..., order_id: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., agent_secret: _Optional[str] = ...) -> None: ...

class AckOrderResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TrainerExitRequest(_message.Message):
    __slots__ = ("host_id", "replica_id", "rank", "exit_code", "signal", "stderr_tail", "gave_up", "agent_secret", "version")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STDERR_TAIL_FIELD_NUMBER: _ClassVar[int]
    GAVE_UP_FIELD_NUMBER: _ClassVar[int]
    AGENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    replica_id: str
    rank: int
    exit_code: int
    signal: int
    stderr_tail: str
    gave_up: bool
    agent_secret: str
    version: int
    def __init__(self, host_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., rank: _Optional[int] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., stderr_tail: _Optional[str] = ..., gave_up: _Optional[bool] = ..., agent_secret: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class TrainerExitResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TelemetryReport(_message.Message):
    __slots__ = ("host_id", "agent_secret", "window_collectives", "ranks")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    WINDOW_COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    agent_secret: str
    window_collectives: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankTelemetry]
    def __init__(self, host_id: _Optional[str] = ..., agent_secret: _Optional[str] = ..., window_collectives: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankTelemetry, _Mapping]]] = ...) -> None: ...

class RankTelemetry(_message.Message):
    __slots__ = ("replica_id", "rank", "idle_s", "recording_s", "groups")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    RECORDING_S_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    rank: int
    idle_s: float
    recording_s: float
    groups: _containers.RepeatedCompositeFieldContainer[GroupTelemetry]
    def __init__(self, replica_id: _Optional[str] = ..., rank: _Optional[int] = ..., idle_s: _Optional[float] = ..., recording_s: _Optional[float] = ..., groups: _Optional[_Iterable[_Union[GroupTelemetry, _Mapping]]] = ...) -> None: ...

class GroupTelemetry(_message.Message):
    __slots__ = ("group", "kind", "size", "last_joined_seq", "last_done_seq", "pending_seq", "pending_s", "pending_nbytes", "pending_sent_bytes", "pending_idle_s", "windows")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    LAST_JOINED_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_DONE_SEQ_FIELD_NUMBER: _ClassVar[int]
    PENDING_SEQ_FIELD_NUMBER: _ClassVar[int]
    PENDING_S_FIELD_NUMBER: _ClassVar[int]
    PENDING_NBYTES_FIELD_NUMBER: _ClassVar[int]
    PENDING_SENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PENDING_IDLE_S_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    group: str
    kind: int
    size: int
    last_joined_seq: int
    last_done_seq: int
    pending_seq: int
    pending_s: float
    pending_nbytes: int
    pending_sent_bytes: int
    pending_idle_s: float
    windows: _containers.RepeatedCompositeFieldContainer[TelemetryWindow]
    def __init__(self, group: _Optional[str] = ..., kind: _Optional[int] = ..., size: _Optional[int] = ..., last_joined_seq: _Optional[int] = ..., last_done_seq: _Optional[int] = ..., pending_seq: _Optional[int] = ..., pending_s: _Optional[float] = ..., pending_nbytes: _Optional[int] = ..., pending_sent_bytes: _Optional[int] = ..., pending_idle_s: _Optional[float] = ..., windows: _Optional[_Iterable[_Union[TelemetryWindow, _Mapping]]] = ...) -> None: ...

class TelemetryWindow(_message.Message):
    __slots__ = ("index", "own_s", "wait_s", "disturbed")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    OWN_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    DISTURBED_FIELD_NUMBER: _ClassVar[int]
    index: int
    own_s: float
    wait_s: float
    disturbed: bool
    def __init__(self, index: _Optional[int] = ..., own_s: _Optional[float] = ..., wait_s: _Optional[float] = ..., disturbed: _Optional[bool] = ...) -> None: ...

class TelemetryResponse(_message.Message):
    __slots__ = ("ignored",)
    IGNORED_FIELD_NUMBER: _ClassVar[int]
    ignored: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ignored: _Optional[_Iterable[str]] = ...) -> None: ...
