/**
 * The pause before retry number `retry` (1 for the first): drawn at random between zero and
 * `initialMs × 2^(retry-1)`, capped at `maxMs` ("full jitter"), so that clients that failed
 * together do not come back together.
 */
export function backoffDelayMs(
  retry: number,
  initialMs: number,
  maxMs: number,
  random: () => number = Math.random,
): number {
  const ceiling = Math.min(maxMs, initialMs * 2 ** (retry - 1));
  return random() * ceiling;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
