from protos import controller_pb2 as _controller_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RankHello(_message.Message):
    __slots__ = ("rank", "world_size", "job_id", "replica_id", "ftar_address", "state_address", "incarnation", "auth", "nonce", "replica_version")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    FTAR_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_VERSION_FIELD_NUMBER: _ClassVar[int]
    rank: int
    world_size: int
    job_id: str
    replica_id: str
    ftar_address: str
    state_address: str
    incarnation: str
    auth: bytes
    nonce: bytes
    replica_version: int
    def __init__(self, rank: _Optional[int] = ..., world_size: _Optional[int] = ..., job_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., ftar_address: _Optional[str] = ..., state_address: _Optional[str] = ..., incarnation: _Optional[str] = ..., auth: _Optional[bytes] = ..., nonce: _Optional[bytes] = ..., replica_version: _Optional[int] = ...) -> None: ...

class BeginStep(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...

class StepVote(_message.Message):
    __slots__ = ("attempt", "ok", "reason", "loss", "tokens")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    ok: bool
    reason: str
    loss: float
    tokens: int
    def __init__(self, attempt: _Optional[int] = ..., ok: _Optional[bool] = ..., reason: _Optional[str] = ..., loss: _Optional[float] = ..., tokens: _Optional[int] = ...) -> None: ...

class StateDigest(_message.Message):
    __slots__ = ("attempt", "step", "sha256")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    step: int
    sha256: bytes
    def __init__(self, attempt: _Optional[int] = ..., step: _Optional[int] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class CloseRank(_message.Message):
    __slots__ = ("step", "reason")
    STEP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    step: int
    reason: str
    def __init__(self, step: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class RelayHello(_message.Message):
    __slots__ = ("group", "fanout", "world_size", "job_id", "replica_id", "address", "incarnation", "auth", "nonce")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FANOUT_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    group: int
    fanout: int
    world_size: int
    job_id: str
    replica_id: str
    address: str
    incarnation: str
    auth: bytes
    nonce: bytes
    def __init__(self, group: _Optional[int] = ..., fanout: _Optional[int] = ..., world_size: _Optional[int] = ..., job_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., address: _Optional[str] = ..., incarnation: _Optional[str] = ..., auth: _Optional[bytes] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class Relayed(_message.Message):
    __slots__ = ("rank", "frame")
    RANK_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    rank: int
    frame: RankFrame
    def __init__(self, rank: _Optional[int] = ..., frame: _Optional[_Union[RankFrame, _Mapping]] = ...) -> None: ...

class GroupBegin(_message.Message):
    __slots__ = ("step", "ranks")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    step: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, step: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class GroupVote(_message.Message):
    __slots__ = ("attempt", "ok", "ranks", "reason", "loss_sum", "tokens")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LOSS_SUM_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    ok: bool
    ranks: _containers.RepeatedScalarFieldContainer[int]
    reason: str
    loss_sum: float
    tokens: int
    def __init__(self, attempt: _Optional[int] = ..., ok: _Optional[bool] = ..., ranks: _Optional[_Iterable[int]] = ..., reason: _Optional[str] = ..., loss_sum: _Optional[float] = ..., tokens: _Optional[int] = ...) -> None: ...

class GroupDigests(_message.Message):
    __slots__ = ("attempt", "step", "ranks", "sha256")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    step: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    sha256: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, attempt: _Optional[int] = ..., step: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ..., sha256: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RankLeft(_message.Message):
    __slots__ = ("rank", "reason")
    RANK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    rank: int
    reason: str
    def __init__(self, rank: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class RankFrame(_message.Message):
    __slots__ = ("hello", "begin", "vote", "digest", "close", "relay_hello", "relayed", "group_begin", "group_vote", "group_digests", "rank_left")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    VOTE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    RELAY_HELLO_FIELD_NUMBER: _ClassVar[int]
    RELAYED_FIELD_NUMBER: _ClassVar[int]
    GROUP_BEGIN_FIELD_NUMBER: _ClassVar[int]
    GROUP_VOTE_FIELD_NUMBER: _ClassVar[int]
    GROUP_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    RANK_LEFT_FIELD_NUMBER: _ClassVar[int]
    hello: RankHello
    begin: BeginStep
    vote: StepVote
    digest: StateDigest
    close: CloseRank
    relay_hello: RelayHello
    relayed: Relayed
    group_begin: GroupBegin
    group_vote: GroupVote
    group_digests: GroupDigests
    rank_left: RankLeft
    def __init__(self, hello: _Optional[_Union[RankHello, _Mapping]] = ..., begin: _Optional[_Union[BeginStep, _Mapping]] = ..., vote: _Optional[_Union[StepVote, _Mapping]] = ..., digest: _Optional[_Union[StateDigest, _Mapping]] = ..., close: _Optional[_Union[CloseRank, _Mapping]] = ..., relay_hello: _Optional[_Union[RelayHello, _Mapping]] = ..., relayed: _Optional[_Union[Relayed, _Mapping]] = ..., group_begin: _Optional[_Union[GroupBegin, _Mapping]] = ..., group_vote: _Optional[_Union[GroupVote, _Mapping]] = ..., group_digests: _Optional[_Union[GroupDigests, _Mapping]] = ..., rank_left: _Optional[_Union[RankLeft, _Mapping]] = ...) -> None: ...

class StepPlan(_message.Message):
    __slots__ = ("attempt", "step", "quorum", "peers")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    step: int
    quorum: _controller_pb2.QuorumResponse
    peers: PeerAddresses
    def __init__(self, attempt: _Optional[int] = ..., step: _Optional[int] = ..., quorum: _Optional[_Union[_controller_pb2.QuorumResponse, _Mapping]] = ..., peers: _Optional[_Union[PeerAddresses, _Mapping]] = ...) -> None: ...

class PeerAddresses(_message.Message):
    __slots__ = ("replica_ids", "ftar_addresses", "state_addresses")
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    FTAR_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    STATE_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    replica_ids: _containers.RepeatedScalarFieldContainer[str]
    ftar_addresses: _containers.RepeatedScalarFieldContainer[str]
    state_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica_ids: _Optional[_Iterable[str]] = ..., ftar_addresses: _Optional[_Iterable[str]] = ..., state_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class NoPlan(_message.Message):
    __slots__ = ("attempt", "step", "kind", "reason")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[NoPlan.Kind]
        RETRY: _ClassVar[NoPlan.Kind]
        FINISHED: _ClassVar[NoPlan.Kind]
        FATAL: _ClassVar[NoPlan.Kind]
    KIND_UNSPECIFIED: NoPlan.Kind
    RETRY: NoPlan.Kind
    FINISHED: NoPlan.Kind
    FATAL: NoPlan.Kind
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    step: int
    kind: NoPlan.Kind
    reason: str
    def __init__(self, attempt: _Optional[int] = ..., step: _Optional[int] = ..., kind: _Optional[_Union[NoPlan.Kind, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class StepDecision(_message.Message):
    __slots__ = ("attempt", "quorum_id", "step", "outcome", "reason")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[StepDecision.Outcome]
        COMMIT: _ClassVar[StepDecision.Outcome]
        RETRY: _ClassVar[StepDecision.Outcome]
    OUTCOME_UNSPECIFIED: StepDecision.Outcome
    COMMIT: StepDecision.Outcome
    RETRY: StepDecision.Outcome
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    quorum_id: int
    step: int
    outcome: StepDecision.Outcome
    reason: str
    def __init__(self, attempt: _Optional[int] = ..., quorum_id: _Optional[int] = ..., step: _Optional[int] = ..., outcome: _Optional[_Union[StepDecision.Outcome, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ReplicaFinished(_message.Message):
    __slots__ = ("step", "clean", "reason")
    STEP_FIELD_NUMBER: _ClassVar[int]
    CLEAN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    step: int
    clean: bool
    reason: str
    def __init__(self, step: _Optional[int] = ..., clean: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("reason", "retry")
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    reason: str
    retry: bool
    def __init__(self, reason: _Optional[str] = ..., retry: _Optional[bool] = ...) -> None: ...

class Challenge(_message.Message):
    __slots__ = ("nonce",)
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    def __init__(self, nonce: _Optional[bytes] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("auth", "relay_address")
    AUTH_FIELD_NUMBER: _ClassVar[int]
    RELAY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    auth: bytes
    relay_address: str
    def __init__(self, auth: _Optional[bytes] = ..., relay_address: _Optional[str] = ...) -> None: ...

class ToRanks(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[Addressed]
    def __init__(self, frames: _Optional[_Iterable[_Union[Addressed, _Mapping]]] = ...) -> None: ...

class Addressed(_message.Message):
    __slots__ = ("rank", "frame")
    RANK_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    rank: int
    frame: bytes
    def __init__(self, rank: _Optional[int] = ..., frame: _Optional[bytes] = ...) -> None: ...

class CoordinatorFrame(_message.Message):
    __slots__ = ("plan", "no_plan", "decision", "finished", "refusal", "challenge", "welcome", "to_ranks")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    NO_PLAN_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    TO_RANKS_FIELD_NUMBER: _ClassVar[int]
    plan: StepPlan
    no_plan: NoPlan
    decision: StepDecision
    finished: ReplicaFinished
    refusal: Refusal
    challenge: Challenge
    welcome: Welcome
    to_ranks: ToRanks
    def __init__(self, plan: _Optional[_Union[StepPlan, _Mapping]] = ..., no_plan: _Optional[_Union[NoPlan, _Mapping]] = ..., decision: _Optional[_Union[StepDecision, _Mapping]] = ..., finished: _Optional[_Union[ReplicaFinished, _Mapping]] = ..., refusal: _Optional[_Union[Refusal, _Mapping]] = ..., challenge: _Optional[_Union[Challenge, _Mapping]] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., to_ranks: _Optional[_Union[ToRanks, _Mapping]] = ...) -> None: ...
