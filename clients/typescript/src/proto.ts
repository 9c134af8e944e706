// The wire layer: loads floodgate's protos with proto-loader and builds the gRPC stub. The
// types imported here are generated from the same protos at build time (src/generated, not
// committed); nothing outside the client modules sees them.
import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import type { ProtoGrpcType } from "./generated/rls";
import type { RateLimitServiceClient } from "./generated/envoy/service/ratelimit/v3/RateLimitService";

export type { RateLimitRequest } from "./generated/envoy/service/ratelimit/v3/RateLimitRequest";
export type { RateLimitResponse__Output as RateLimitResponse } from "./generated/envoy/service/ratelimit/v3/RateLimitResponse";
export type { RateLimitDescriptor } from "./generated/envoy/extensions/common/ratelimit/v3/RateLimitDescriptor";
export type { RateLimitServiceClient };

/** The package's proto/ folder: a copy of the repository's, shipped inside the tarball. */
const PROTO_ROOT = path.join(__dirname, "..", "proto");
const RLS_PROTO = "envoy/service/ratelimit/v3/rls.proto";

// These options decide the shape of decoded messages. scripts/gen-proto.mjs passes the same
// ones to proto-loader-gen-types, so the generated types describe what really arrives.
const LOADER_OPTIONS: protoLoader.Options = {
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTO_ROOT],
};

let definitions: ProtoGrpcType | undefined;

/** Parses the protos once per process, on first use. */
function loadDefinitions(): ProtoGrpcType {
  if (definitions === undefined) {
    const packageDefinition = protoLoader.loadSync(RLS_PROTO, LOADER_OPTIONS);
    definitions = grpc.loadPackageDefinition(packageDefinition) as unknown as ProtoGrpcType;
  }
  return definitions;
}

/** The service's full name, as gRPC's service config names it. */
export const SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService";

/**
 * A stub for `envoy.service.ratelimit.v3.RateLimitService` at `target` (host:port), on a
 * channel with `options` (grpc-js channel options, such as `grpc.service_config`).
 */
export function createStub(
  target: string,
  credentials: grpc.ChannelCredentials,
  options: grpc.ChannelOptions = {},
): RateLimitServiceClient {
  const { RateLimitService } = loadDefinitions().envoy.service.ratelimit.v3;
  return new RateLimitService(target, credentials, options);
}
