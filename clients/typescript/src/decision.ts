import type { RateLimitResponse } from "./proto";

/** The unit of a limit, as floodgate reports it. */
export type LimitUnit =
  | "second"
  | "minute"
  | "hour"
  | "day"
  | "week"
  | "month"
  | "year"
  | "unknown";

/** The limit that decided a descriptor. */
export interface Limit {
  readonly requestsPerUnit: number;
  readonly unit: LimitUnit;
  /** The window is this many units long (1 unless the rule sets `unit_multiplier`). */
  readonly unitMultiplier: number;
  /** The rule's `name`, when it has one. */
  readonly name: string | undefined;
}

/** floodgate's answer for one descriptor, in the order the descriptors were sent. */
export interface DescriptorStatus {
  readonly allowed: boolean;
  /** Undefined when no rule limits the descriptor (or the decision is degraded). */
  readonly limit: Limit | undefined;
  /** Quota left after this request. */
  readonly remaining: number;
  /** Seconds (fractional) until quota comes back; when exhausted, until one more request fits. */
  readonly resetSeconds: number;
}

/** The answer to one `shouldRateLimit` call. */
export interface Decision {
  readonly allowed: boolean;
  readonly statuses: readonly DescriptorStatus[];
  /**
   * The headers floodgate asks to add to the HTTP response (RateLimit-Policy, RateLimit,
   * X-RateLimit-*, Retry-After, depending on the server's `response_headers` setting), keyed
   * by lower-case name. Empty when the server sends none, and on a degraded decision.
   */
  readonly headers: Readonly<Record<string, string>>;
  /** True when floodgate could not be reached and the client's failure mode decided. */
  readonly degraded: boolean;
}

type WireStatus = RateLimitResponse["statuses"][number];
type WireLimit = NonNullable<WireStatus["currentLimit"]>;
type WireDuration = WireStatus["durationUntilReset"];
type WireHeader = RateLimitResponse["responseHeadersToAdd"][number];

/** The decision a server response carries. */
export function decisionFromResponse(response: RateLimitResponse): Decision {
  return {
    // Like Envoy, only OVER_LIMIT rejects: UNKNOWN counts as allowed.
    allowed: response.overallCode !== "OVER_LIMIT",
    statuses: response.statuses.map(statusFromWire),
    headers: headersFromWire(response.responseHeadersToAdd),
    degraded: false,
  };
}

/** The decision the failure mode makes for `descriptorCount` descriptors without the server. */
export function degradedDecision(allowed: boolean, descriptorCount: number): Decision {
  const status: DescriptorStatus = { allowed, limit: undefined, remaining: 0, resetSeconds: 0 };
  return {
    allowed,
    statuses: Array.from({ length: descriptorCount }, () => status),
    headers: {},
    degraded: true,
  };
}

function statusFromWire(status: WireStatus): DescriptorStatus {
  return {
    allowed: status.code !== "OVER_LIMIT",
    limit: status.currentLimit === null ? undefined : limitFromWire(status.currentLimit),
    remaining: status.limitRemaining,
    resetSeconds: secondsOf(status.durationUntilReset),
  };
}

function limitFromWire(limit: WireLimit): Limit {
  return {
    requestsPerUnit: limit.requestsPerUnit,
    unit: lowerCase(limit.unit),
    // An absent multiplier means a window of one unit.
    unitMultiplier: limit.unitMultiplier?.value || 1,
    name: limit.name === "" ? undefined : limit.name,
  };
}

/** Lower-cases a wire enum name; the result type checks that LimitUnit covers every unit. */
function lowerCase<Name extends string>(name: Name): Lowercase<Name> {
  return name.toLowerCase() as Lowercase<Name>;
}

function secondsOf(duration: WireDuration): number {
  return duration === null ? 0 : duration.seconds + duration.nanos / 1e9;
}

/** Header values arrive as text in `value`, or as bytes in `raw_value` when not valid text. */
function headersFromWire(headers: readonly WireHeader[]): Record<string, string> {
  const record: Record<string, string> = {};
  for (const header of headers) {
    const name = header.key.toLowerCase();
    const value = header.value !== "" ? header.value : header.rawValue.toString("utf8");
    // A repeated header becomes one list-valued header, as HTTP allows.
    record[name] = name in record ? `${record[name]}, ${value}` : value;
  }
  return record;
}
