/**
 * How long to wait before retry number `retry` (0 for the first): exponential in the retry
 * number, with "equal jitter" — half of the step is fixed and half random — so that clients
 * that failed together do not come back together, yet every retry still waits a little.
 */
export function backoffDelayMs(
  retry: number,
  baseMs: number,
  random: () => number = Math.random,
): number {
  const step = baseMs * 2 ** retry;
  return step / 2 + random() * (step / 2);
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
