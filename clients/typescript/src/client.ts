import * as grpc from "@grpc/grpc-js";
import { backoffDelayMs, sleep } from "./backoff";
import { decisionFromResponse, degradedDecision, type Decision } from "./decision";
import { toWireDescriptor, type Descriptor } from "./descriptor";
import { FloodgateError } from "./errors";
import {
  createStub,
  type RateLimitRequest,
  type RateLimitResponse,
  type RateLimitServiceClient,
} from "./proto";

/**
 * What to decide when floodgate cannot answer (UNAVAILABLE after every retry, or a deadline
 * exceeded): "open" allows the request, "closed" rejects it. Either way the decision is
 * marked `degraded`.
 */
export type FailureMode = "open" | "closed";

export interface FloodgateClientOptions {
  /** Deadline of each attempt, in milliseconds. Default 20. */
  readonly timeoutMs?: number;
  /** Default "open". */
  readonly failureMode?: FailureMode;
  /** Extra attempts after an UNAVAILABLE answer (never after any other error). Default 2. */
  readonly retries?: number;
  /** First backoff step in milliseconds; it doubles with each retry, with jitter. Default 10. */
  readonly backoffMs?: number;
  /** Channel credentials. Default: plaintext (`grpc.credentials.createInsecure()`). */
  readonly credentials?: grpc.ChannelCredentials;
  /** Called with every failed attempt (1 for the first), e.g. to log or count failures. */
  readonly onAttemptFailed?: (error: FloodgateError, attempt: number) => void;
}

/** The largest value of the wire's uint32 `hits_addend`. */
const MAX_HITS = 0xffff_ffff;

/**
 * A client of floodgate's rate-limit service (Envoy's `RateLimitService` v3). One instance
 * holds one HTTP/2 channel: create it once and share it.
 */
export class FloodgateClient {
  readonly #stub: RateLimitServiceClient;
  readonly #timeoutMs: number;
  readonly #failureMode: FailureMode;
  readonly #retries: number;
  readonly #backoffMs: number;
  readonly #onAttemptFailed: ((error: FloodgateError, attempt: number) => void) | undefined;
  #closed = false;

  /** `target` is floodgate's gRPC address, such as "127.0.0.1:8081". */
  constructor(target: string, options: FloodgateClientOptions = {}) {
    this.#timeoutMs = positive("timeoutMs", options.timeoutMs ?? 20);
    this.#failureMode = failureMode(options.failureMode ?? "open");
    this.#retries = count("retries", options.retries ?? 2);
    this.#backoffMs = nonNegative("backoffMs", options.backoffMs ?? 10);
    this.#onAttemptFailed = options.onAttemptFailed;
    this.#stub = createStub(target, options.credentials ?? grpc.credentials.createInsecure());
  }

  /**
   * Asks whether a request described by `descriptors` in `domain` is within its limits, and
   * counts `hits` against every descriptor's quota (0 is taken as 1 by the server).
   * Resolves with the decision, a degraded one when the failure mode decides; rejects with a
   * FloodgateError for any other failure, such as a request the server refuses.
   */
  async shouldRateLimit(
    domain: string,
    descriptors: readonly Descriptor[],
    hits = 1,
  ): Promise<Decision> {
    const request: RateLimitRequest = {
      domain,
      descriptors: descriptors.map(toWireDescriptor),
      hitsAddend: hitsAddend(hits),
    };
    for (let attempt = 1; ; attempt++) {
      try {
        return decisionFromResponse(await this.#call(request));
      } catch (error) {
        const failure = asFloodgateError(error);
        this.#onAttemptFailed?.(failure, attempt);
        if (failure.code === grpc.status.UNAVAILABLE && attempt <= this.#retries) {
          await sleep(backoffDelayMs(attempt - 1, this.#backoffMs));
          continue;
        }
        if (isUnreachable(failure)) {
          return degradedDecision(this.#failureMode === "open", descriptors.length);
        }
        throw failure;
      }
    }
  }

  /** Closes the channel. Calls made afterwards reject with a FloodgateError (CANCELLED). */
  close(): void {
    this.#closed = true;
    this.#stub.close();
  }

  /** One attempt, bounded by its own deadline. */
  #call(request: RateLimitRequest): Promise<RateLimitResponse> {
    if (this.#closed) {
      return Promise.reject(new FloodgateError(grpc.status.CANCELLED, "the client is closed"));
    }
    const deadline = Date.now() + this.#timeoutMs;
    return new Promise((resolve, reject) => {
      this.#stub.ShouldRateLimit(request, { deadline }, (error, response) => {
        if (error) {
          reject(FloodgateError.fromServiceError(error));
        } else if (response === undefined) {
          reject(new FloodgateError(grpc.status.INTERNAL, "empty response"));
        } else {
          resolve(response);
        }
      });
    });
  }
}

/** The failures the failure mode decides: floodgate did not answer in time, or at all. */
function isUnreachable(error: FloodgateError): boolean {
  return error.code === grpc.status.UNAVAILABLE || error.code === grpc.status.DEADLINE_EXCEEDED;
}

function asFloodgateError(error: unknown): FloodgateError {
  if (error instanceof FloodgateError) {
    return error;
  }
  const message = error instanceof Error ? error.message : String(error);
  return new FloodgateError(grpc.status.INTERNAL, message);
}

function hitsAddend(hits: number): number {
  if (!Number.isInteger(hits) || hits < 0 || hits > MAX_HITS) {
    throw new RangeError(`hits must be an integer from 0 to ${MAX_HITS}, got ${hits}`);
  }
  return hits;
}

function positive(name: string, value: number): number {
  if (!(Number.isFinite(value) && value > 0)) {
    throw new RangeError(`${name} must be a positive number, got ${value}`);
  }
  return value;
}

function nonNegative(name: string, value: number): number {
  if (!(Number.isFinite(value) && value >= 0)) {
    throw new RangeError(`${name} must be zero or more, got ${value}`);
  }
  return value;
}

function count(name: string, value: number): number {
  if (!(Number.isInteger(value) && value >= 0)) {
    throw new RangeError(`${name} must be a whole number, zero or more, got ${value}`);
  }
  return value;
}

function failureMode(value: string): FailureMode {
  if (value !== "open" && value !== "closed") {
    throw new RangeError(`failureMode must be "open" or "closed", got ${JSON.stringify(value)}`);
  }
  return value;
}
