"""gRPC server reflection (docs/operations.md#grpc-reflection): what `grpcurl list` / `grpcurl
describe` see.

A reflection client (grpcio-reflection's `ProtoReflectionDescriptorDatabase`, the
reference client) talks to a real replica, lists its services, resolves the request
messages field by field, and calls an RPC with a message class built only from the
reflected descriptors, the way a generic client without our generated code would.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from agenttx.v1 import agenttx_pb2

F = FieldDescriptor


@pytest.fixture
def reflected(replicas) -> tuple[ProtoReflectionDescriptorDatabase, DescriptorPool]:
    database = ProtoReflectionDescriptorDatabase(replicas[0].channel)
    return database, DescriptorPool(database)


def fields(pool: DescriptorPool, message: str) -> list[tuple[int, str, int, str]]:
    """(number, name, type, message or enum type name) of each field, in number order."""
    d = pool.FindMessageTypeByName(message)
    return [(f.number, f.name, f.type,
             (f.message_type or f.enum_type).full_name if (f.message_type or f.enum_type)
             else "") for f in sorted(d.fields, key=lambda f: f.number)]


def test_reflection_lists_the_service_health_and_reflection(reflected):
    database, _ = reflected
    assert sorted(database.get_services()) == [
        "agenttx.v1.AgentTxService", "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection"]


def test_the_service_resolves_with_every_method_and_its_messages(reflected):
    _, pool = reflected
    service = pool.FindServiceByName("agenttx.v1.AgentTxService")
    assert [(m.name, m.input_type.full_name, m.output_type.full_name)
            for m in service.methods] == [
        (name, f"agenttx.v1.{name}Request", f"agenttx.v1.{name}Response")
        for name in ("BeginTransaction", "ExecuteStep", "CommitTransaction",
                     "RollbackTransaction", "GetTransaction", "ListTransactions")] + [
        ("GetTransactionHistory", "agenttx.v1.GetTransactionHistoryRequest",
         "agenttx.v1.TransactionHistory"),
        ("ListTools", "agenttx.v1.ListToolsRequest", "agenttx.v1.ListToolsResponse"),
        ("ListApprovals", "agenttx.v1.ListApprovalsRequest", "agenttx.v1.ListApprovalsResponse"),
        ("DecideApproval", "agenttx.v1.DecideApprovalRequest",
         "agenttx.v1.DecideApprovalResponse"),
        ("ListDeadLetters", "agenttx.v1.ListDeadLettersRequest",
         "agenttx.v1.ListDeadLettersResponse"),
        ("RetryDeadLetter", "agenttx.v1.DeadLetterRequest", "agenttx.v1.DeadLetterResponse"),
        ("DiscardDeadLetter", "agenttx.v1.DeadLetterRequest", "agenttx.v1.DeadLetterResponse"),
        ("GetServiceStatus", "agenttx.v1.GetServiceStatusRequest", "agenttx.v1.ServiceStatus")]
    # the server describes exactly the file our generated code was built from
    served = descriptor_pb2.FileDescriptorProto()
    pool.FindFileContainingSymbol("agenttx.v1.AgentTxService").CopyToProto(served)
    ours = descriptor_pb2.FileDescriptorProto()
    agenttx_pb2.DESCRIPTOR.CopyToProto(ours)
    assert served == ours
    health = pool.FindServiceByName("grpc.health.v1.Health")
    assert {m.name: m.input_type.full_name for m in health.methods} == {
        "Check": "grpc.health.v1.HealthCheckRequest",
        "List": "grpc.health.v1.HealthListRequest",
        "Watch": "grpc.health.v1.HealthCheckRequest"}


def test_request_messages_resolve_with_their_fields(reflected):
    _, pool = reflected
    assert fields(pool, "agenttx.v1.ExecuteStepRequest") == [
        (1, "transaction_id", F.TYPE_STRING, ""),
        (2, "step_id", F.TYPE_UINT32, ""),
        (3, "tool_name", F.TYPE_STRING, ""),
        (4, "arguments_json", F.TYPE_STRING, ""),
        (5, "raw_context", F.TYPE_STRING, "")]
    assert fields(pool, "agenttx.v1.ListTransactionsRequest") == [
        (1, "page_size", F.TYPE_UINT32, ""),
        (2, "page_token", F.TYPE_STRING, ""),
        (3, "status", F.TYPE_ENUM, "agenttx.v1.TransactionStatus"),
        (4, "agent_id_prefix", F.TYPE_STRING, "")]
    status = pool.FindEnumTypeByName("agenttx.v1.TransactionStatus")
    assert "TRANSACTION_STATUS_AWAITING_ROLLBACK" in status.values_by_name


def test_a_client_built_from_reflection_alone_can_call_the_service(reflected, replicas):
    _, pool = reflected
    request_class = GetMessageClass(pool.FindMessageTypeByName(
        "agenttx.v1.GetTransactionRequest"))
    response_class = GetMessageClass(pool.FindMessageTypeByName(
        "agenttx.v1.GetTransactionResponse"))
    call = replicas[0].channel.unary_unary(
        "/agenttx.v1.AgentTxService/GetTransaction",
        request_serializer=lambda msg: msg.SerializeToString(),
        response_deserializer=response_class.FromString)
    with pytest.raises(grpc.RpcError) as raised:
        call(request_class(transaction_id="00000000-0000-4000-8000-000000000000"), timeout=10)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert "00000000-0000-4000-8000-000000000000" in (raised.value.details() or "")
