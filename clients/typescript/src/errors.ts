import { Metadata, status, type ServiceError } from "@grpc/grpc-js";

/**
 * A call to floodgate that failed and that the failure mode does not decide: a request the
 * server refused (INVALID_ARGUMENT, with the server's message in `details`), or any status
 * other than UNAVAILABLE and DEADLINE_EXCEEDED (a server that is not a rate-limit service,
 * refused credentials, a server bug). Also passed to `onAttemptFailed` for every failed
 * attempt.
 */
export class FloodgateError extends Error {
  /** The gRPC status code (`@grpc/grpc-js`'s `status`). */
  readonly code: status;
  /** The status name, such as "INVALID_ARGUMENT". */
  readonly codeName: string;
  /** The server's message, as it sent it. */
  readonly details: string;
  /** The status's metadata (gRPC trailers), such as floodgate's `floodgate-counted`. */
  readonly metadata: Metadata;

  constructor(code: status, details: string, metadata: Metadata = new Metadata()) {
    const codeName = status[code] ?? `code ${code}`;
    super(`floodgate ShouldRateLimit failed: ${codeName}: ${details}`);
    this.name = "FloodgateError";
    this.code = code;
    this.codeName = codeName;
    this.details = details;
    this.metadata = metadata;
  }

  /** Wraps the error grpc-js reports for a failed call. */
  static fromServiceError(error: ServiceError): FloodgateError {
    return new FloodgateError(error.code, error.details, error.metadata);
  }
}
