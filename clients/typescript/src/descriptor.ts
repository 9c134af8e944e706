import type { RateLimitDescriptor } from "./proto";

/**
 * One rate-limit descriptor: key/value entries, matched against the rules level by level in
 * order. Either an object (`{ user_id: "alice" }`) or a list of pairs
 * (`[["path", "/a"], ["method", "GET"]]`). Use the list when order matters and a key looks
 * like an integer: JavaScript puts such object keys first, whatever order they were written in.
 */
export type Descriptor =
  | Readonly<Record<string, string>>
  | ReadonlyArray<readonly [key: string, value: string]>;

/** The descriptor as the wire message carries it. */
export function toWireDescriptor(descriptor: Descriptor): RateLimitDescriptor {
  const pairs = isPairList(descriptor) ? descriptor : Object.entries(descriptor);
  return { entries: pairs.map(([key, value]) => ({ key, value })) };
}

function isPairList(
  descriptor: Descriptor,
): descriptor is ReadonlyArray<readonly [string, string]> {
  return Array.isArray(descriptor);
}
