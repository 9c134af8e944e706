// Which failed attempts are sent again, after how long, and which the failure mode decides:
// the same rules as the Rust and Python clients (docs/clients.md in the repository).
import * as grpc from "@grpc/grpc-js";
import { backoffDelayMs } from "./backoff";
import type { FloodgateError } from "./errors";
import { SERVICE_NAME } from "./proto";

/** The most attempts one call makes; gRPC's retry policy has the same limit. */
export const MAX_ATTEMPTS = 5;

/**
 * floodgate's trailer on an UNAVAILABLE that counted nothing (its circuit breaker was open,
 * the request was shed, Redis could not be reached or ran nothing).
 */
const COUNTED_KEY = "floodgate-counted";
const NOTHING_COUNTED = "none";

export interface RetryOptions {
  readonly maxAttempts: number;
  readonly initialBackoffMs: number;
  readonly maxBackoffMs: number;
  readonly retryPossiblyCounted: boolean;
}

/** A client's retries: its own for marked answers, or gRPC's policy for every UNAVAILABLE. */
export class RetryPolicy {
  readonly #options: RetryOptions;

  constructor(options: RetryOptions) {
    const { maxAttempts, initialBackoffMs, maxBackoffMs } = options;
    if (!(Number.isInteger(maxAttempts) && maxAttempts >= 1 && maxAttempts <= MAX_ATTEMPTS)) {
      throw new RangeError(
        `maxAttempts must be an integer from 1 to ${MAX_ATTEMPTS}, got ${maxAttempts}`,
      );
    }
    if (!(Number.isFinite(initialBackoffMs) && initialBackoffMs > 0)) {
      throw new RangeError(`initialBackoffMs must be a positive number, got ${initialBackoffMs}`);
    }
    if (!(Number.isFinite(maxBackoffMs) && maxBackoffMs >= initialBackoffMs)) {
      throw new RangeError(
        `maxBackoffMs must be at least initialBackoffMs (${initialBackoffMs}), got ${maxBackoffMs}`,
      );
    }
    this.#options = options;
  }

  /**
   * Channel options: gRPC's own retry policy when every UNAVAILABLE may be sent again. It
   * sees only status codes, not floodgate's marker, so it fits only `retryPossiblyCounted`;
   * then it makes every attempt inside the one call and its deadline.
   */
  channelOptions(): grpc.ChannelOptions {
    const { maxAttempts, initialBackoffMs, maxBackoffMs, retryPossiblyCounted } = this.#options;
    if (!retryPossiblyCounted || maxAttempts === 1) {
      return {};
    }
    const retryPolicy = {
      maxAttempts,
      initialBackoff: duration(initialBackoffMs),
      maxBackoff: duration(maxBackoffMs),
      backoffMultiplier: 2,
      retryableStatusCodes: ["UNAVAILABLE"],
    };
    const serviceConfig = {
      methodConfig: [
        { name: [{ service: SERVICE_NAME, method: "ShouldRateLimit" }], retryPolicy },
      ],
    };
    return { "grpc.service_config": JSON.stringify(serviceConfig), "grpc.enable_retries": 1 };
  }

  /**
   * Milliseconds to wait before sending again after attempt `attempt` failed with `failure`,
   * or undefined when the call ends here. Only an UNAVAILABLE that floodgate marked as
   * counting nothing is sent again, up to `maxAttempts` and only while the wait ends before
   * `deadline` (a `Date.now()` value). An unmarked one may have been counted (floodgate
   * answers UNAVAILABLE after a Redis timeout when the script may have run), so it ends the
   * call; under `retryPossiblyCounted` gRPC's retry policy has already made its attempts.
   */
  nextDelayMs(failure: FloodgateError, attempt: number, deadline: number): number | undefined {
    const { maxAttempts, initialBackoffMs, maxBackoffMs, retryPossiblyCounted } = this.#options;
    if (retryPossiblyCounted || attempt >= maxAttempts) {
      return undefined;
    }
    if (failure.code !== grpc.status.UNAVAILABLE || !countedNothing(failure)) {
      return undefined;
    }
    const delay = backoffDelayMs(attempt, initialBackoffMs, maxBackoffMs);
    return Date.now() + delay < deadline ? delay : undefined;
  }
}

/** Whether floodgate's trailers say that no hit of the failed call was counted. */
export function countedNothing(failure: FloodgateError): boolean {
  return failure.metadata.get(COUNTED_KEY).some((value) => value === NOTHING_COUNTED);
}

/**
 * The failures the failure mode decides: floodgate could not answer (down, unreachable, its
 * backend down, the connection lost) or not in time. Every other status is thrown: it would
 * repeat on every call, and failing open on it would hide the bug.
 */
export function failsOpen(failure: FloodgateError): boolean {
  return failure.code === grpc.status.UNAVAILABLE || failure.code === grpc.status.DEADLINE_EXCEEDED;
}

/** A protobuf JSON duration, as gRPC's service config wants it (at most 9 decimals). */
function duration(ms: number): string {
  return `${(ms / 1000).toFixed(9)}s`;
}
