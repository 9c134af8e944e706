// floodgate-client: a typed client and an Express-style middleware for floodgate's
// rate-limit service (Envoy's envoy.service.ratelimit.v3.RateLimitService).
export { FloodgateClient, type FailureMode, type FloodgateClientOptions } from "./client";
export type { Decision, DescriptorStatus, Limit, LimitUnit } from "./decision";
export type { Descriptor } from "./descriptor";
export { FloodgateError } from "./errors";
export {
  rateLimit,
  type NextFunction,
  type RateLimitOptions,
  type RequestLike,
  type ResponseLike,
} from "./middleware";
