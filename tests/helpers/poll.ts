/** Waiting in tests for something another process does, without asserting how long it takes. */

/**
 * Calls `check` until it returns something other than false, null or undefined, and returns that.
 * The deadline only guards against a hang (a test that waits for ever tells nothing): it is far beyond
 * what the awaited thing needs on a loaded machine, and reaching it fails the test naming `what`.
 *
 * @example
 * ```ts ignore
 * await poll("the model loaded", async () => (await health()).ready);
 * const line = await poll("the request was logged", () => server.logs.find((l) => l.includes(id)));
 * ```
 */
export async function poll<T>(
  what: string,
  check: () => T | false | null | undefined | Promise<T | false | null | undefined>,
  opts: { everyMs?: number; timeoutMs?: number } = {},
): Promise<T> {
  const deadline = Date.now() + (opts.timeoutMs ?? 120_000);
  for (;;) {
    const value = await check();
    if (value !== false && value !== null && value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`gave up waiting until ${what}`);
    await new Promise((r) => setTimeout(r, opts.everyMs ?? 50));
  }
}

/**
 * `promise`, or a failure naming `what` if it has not settled after `timeoutMs`: as with {@link poll},
 * a guard against a hang, not a bound on speed.
 *
 * @example
 * ```ts ignore
 * const second = await settles("the second job ran", run(prompt));
 * ```
 */
export async function settles<T>(what: string, promise: Promise<T>, timeoutMs = 120_000): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const hung = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`gave up waiting until ${what}`)), timeoutMs);
  });
  try {
    return await Promise.race([promise, hung]);
  } finally {
    clearTimeout(timer);
  }
}
