import type { FloodgateClient } from "./client";
import type { Decision } from "./decision";
import type { Descriptor } from "./descriptor";

/** What the middleware needs of a request by default: Express's and node:http's both fit. */
export interface RequestLike {
  readonly headers: Readonly<Record<string, string | readonly string[] | undefined>>;
  readonly method?: string | undefined;
  readonly url?: string | undefined;
}

/** What the middleware needs of a response: Express's and node:http's both fit. */
export interface ResponseLike {
  statusCode: number;
  setHeader(name: string, value: string): unknown;
  end(body: string): unknown;
}

/** Express's `next`: no argument continues, an argument reports an error. */
export type NextFunction = (error?: unknown) => void;

export interface RateLimitOptions<Req> {
  /** Any object with FloodgateClient's `shouldRateLimit`. */
  readonly client: Pick<FloodgateClient, "shouldRateLimit">;
  readonly domain: string;
  /** The request's descriptors; undefined or an empty list lets it through unchecked. */
  readonly descriptors: (req: Req) => readonly Descriptor[] | undefined;
  /** The request's cost. Default 1. */
  readonly hits?: (req: Req) => number;
}

const TOO_MANY_REQUESTS = 429;

/**
 * An Express-style middleware that asks floodgate about every request. Allowed: floodgate's
 * headers are set on the response and `next()` is called. Rejected (over limit, or the
 * client's failure mode is "closed" and floodgate is unreachable): 429 with floodgate's
 * headers and a short plain-text body. Any error the failure mode does not decide, such as
 * a request the server refuses, goes to `next(error)`.
 */
export function rateLimit<Req = RequestLike>(
  options: RateLimitOptions<Req>,
): (req: Req, res: ResponseLike, next: NextFunction) => void {
  const decide = async (req: Req): Promise<Decision | undefined> => {
    const descriptors = options.descriptors(req);
    if (descriptors === undefined || descriptors.length === 0) {
      return undefined;
    }
    const hits = options.hits?.(req) ?? 1;
    return options.client.shouldRateLimit(options.domain, descriptors, hits);
  };

  const handle = async (req: Req, res: ResponseLike, next: NextFunction): Promise<void> => {
    let decision: Decision | undefined;
    try {
      decision = await decide(req);
    } catch (error) {
      next(error);
      return;
    }
    // Outside the try: an error thrown by the next handler is not ours to report.
    if (decision === undefined) {
      next();
      return;
    }
    for (const [name, value] of Object.entries(decision.headers)) {
      res.setHeader(name, value);
    }
    if (decision.allowed) {
      next();
    } else {
      rejectRequest(res);
    }
  };

  return (req, res, next) => {
    void handle(req, res, next);
  };
}

function rejectRequest(res: ResponseLike): void {
  res.statusCode = TOO_MANY_REQUESTS;
  res.setHeader("content-type", "text/plain; charset=utf-8");
  res.end("Too Many Requests\n");
}
