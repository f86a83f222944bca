"""Core orders and assignments to and from their wire form."""

from __future__ import annotations

from controller.core.model import Assignment, OrderOut
from controller.core.rendezvous import Endpoints
from protos import controller_pb2 as pb


def to_proto_assignment(a: Assignment | None, version: int = 0, replica_version: int = 0,
                        meet: Endpoints = Endpoints()) -> pb.Assignment:
    if a is None:
        return pb.Assignment(version=version)
    return pb.Assignment(replica_id=a.replica_id, ranks=list(a.ranks), world_size=a.world_size, version=version,
                         replica_version=replica_version, rendezvous_address=meet.rendezvous,
                         coordinator_address=meet.coordinator)


def from_proto_assignment(a: pb.Assignment) -> Assignment | None:
    if not a.replica_id and not a.ranks:
        return None
    return Assignment(a.replica_id, tuple(a.ranks), a.world_size)


def to_proto_order(o: OrderOut) -> pb.Order:
    return pb.Order(order_id=o.order_id, kind=pb.Order.Kind.Value(o.kind),
                    assignment=to_proto_assignment(o.assignment, o.version, o.replica_version,
                                                   Endpoints(o.rendezvous_address, o.coordinator_address)),
                    reason=o.reason,
                    version=o.version)
