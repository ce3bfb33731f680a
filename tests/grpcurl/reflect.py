"""What grpcurl does, with gRPC's own Python client: lists the services a
server describes by reflection, then calls ShouldRateLimit from the
descriptors it fetched (no Envoy proto files), and prints the answer as
JSON. Usage: reflect.py HOST:PORT DOMAIN KEY=VALUE [HITS]"""

import json
import sys

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

SERVICE = "envoy.service.ratelimit.v3.RateLimitService"


def main():
    target, domain, entry = sys.argv[1], sys.argv[2], sys.argv[3]
    hits = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    channel = grpc.insecure_channel(target)
    db = ProtoReflectionDescriptorDatabase(channel)
    services = sorted(db.get_services())
    pool = descriptor_pool.DescriptorPool(db)
    method = pool.FindServiceByName(SERVICE).FindMethodByName("ShouldRateLimit")
    request_cls = message_factory.GetMessageClass(method.input_type)
    response_cls = message_factory.GetMessageClass(method.output_type)
    key, value = entry.split("=", 1)
    request = json_format.ParseDict(
        {"domain": domain, "descriptors": [{"entries": [{"key": key, "value": value}],
                                            "hitsAddend": str(hits)}]},
        request_cls(),
    )
    call = channel.unary_unary(
        f"/{SERVICE}/ShouldRateLimit",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_cls.FromString,
    )
    answer = call(request, timeout=5)
    print(json.dumps({"services": services,
                      "answer": json_format.MessageToDict(answer)}))


if __name__ == "__main__":
    main()
