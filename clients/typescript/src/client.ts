import * as grpc from "@grpc/grpc-js";
import { sleep } from "./backoff";
import { decisionFromResponse, degradedDecision, type Decision } from "./decision";
import { toWireDescriptor, type Descriptor } from "./descriptor";
import { FloodgateError } from "./errors";
import {
  createStub,
  type RateLimitRequest,
  type RateLimitResponse,
  type RateLimitServiceClient,
} from "./proto";
import { failsOpen, RetryPolicy } from "./retry";

/**
 * What to decide when floodgate cannot answer (UNAVAILABLE after the retries that are allowed,
 * or the deadline passing): "open" allows the request, "closed" rejects it. Either way the
 * decision is marked `degraded`. Never applied to any other error.
 */
export type FailureMode = "open" | "closed";

export interface FloodgateClientOptions {
  /**
   * One deadline over the whole call, in milliseconds: every attempt and every wait between
   * attempts fits in it, each attempt getting what is left. Default 20.
   */
  readonly timeoutMs?: number;
  /** Default "open". */
  readonly failureMode?: FailureMode;
  /** Attempts in all, the first included: 1 (no retries) to 5. Default 3. */
  readonly maxAttempts?: number;
  /**
   * The ceiling of the wait before the first retry, in milliseconds; it doubles with each
   * retry up to `maxBackoffMs`, and the wait is drawn at random below it. Default 2.
   */
  readonly initialBackoffMs?: number;
  /** Default 10. */
  readonly maxBackoffMs?: number;
  /**
   * Also send again an UNAVAILABLE that may already have been counted (floodgate did not
   * mark it `floodgate-counted: none`): for callers who prefer an answer to an exact count.
   * gRPC's own retry policy then makes the attempts. Default false: only marked ones are.
   */
  readonly retryPossiblyCounted?: boolean;
  /** Channel credentials. Default: plaintext (`grpc.credentials.createInsecure()`). */
  readonly credentials?: grpc.ChannelCredentials;
  /**
   * Called with every failed attempt the client makes itself (1 for the first), e.g. to log
   * or count failures. Under `retryPossiblyCounted` gRPC's attempts are one call to it.
   */
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
  readonly #retry: RetryPolicy;
  readonly #onAttemptFailed: ((error: FloodgateError, attempt: number) => void) | undefined;
  #closed = false;

  /** `target` is floodgate's gRPC address, such as "127.0.0.1:8081". */
  constructor(target: string, options: FloodgateClientOptions = {}) {
    this.#timeoutMs = positive("timeoutMs", options.timeoutMs ?? 20);
    this.#failureMode = failureMode(options.failureMode ?? "open");
    this.#retry = new RetryPolicy({
      maxAttempts: options.maxAttempts ?? 3,
      initialBackoffMs: options.initialBackoffMs ?? 2,
      maxBackoffMs: options.maxBackoffMs ?? 10,
      retryPossiblyCounted: options.retryPossiblyCounted ?? false,
    });
    this.#onAttemptFailed = options.onAttemptFailed;
    this.#stub = createStub(
      target,
      options.credentials ?? grpc.credentials.createInsecure(),
      this.#retry.channelOptions(),
    );
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
    const deadline = Date.now() + this.#timeoutMs;
    for (let attempt = 1; ; attempt++) {
      try {
        return decisionFromResponse(await this.#call(request, deadline));
      } catch (error) {
        const failure = asFloodgateError(error);
        this.#onAttemptFailed?.(failure, attempt);
        const delay = this.#retry.nextDelayMs(failure, attempt, deadline);
        if (delay !== undefined) {
          await sleep(delay);
          continue;
        }
        if (failsOpen(failure)) {
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

  /** One attempt, bounded by the call's deadline. */
  #call(request: RateLimitRequest, deadline: number): Promise<RateLimitResponse> {
    if (this.#closed) {
      return Promise.reject(new FloodgateError(grpc.status.CANCELLED, "the client is closed"));
    }
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

function failureMode(value: string): FailureMode {
  if (value !== "open" && value !== "closed") {
    throw new RangeError(`failureMode must be "open" or "closed", got ${JSON.stringify(value)}`);
  }
  return value;
}
