/**
 * GBNF for JSON numbers within bounds (`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`) and
 * for integers that are multiples of a number (`multipleOf`): digit-by-digit automata, so that every
 * number the grammar allows satisfies the bounds exactly (no exponents; at most 16 fraction digits).
 */
import type { GbnfRules } from "./gbnf.ts";

/** No number the range grammar can write lies within the bounds. */
export class EmptyRangeError extends Error {
  constructor() {
    super("no number the grammar can write lies within the bounds");
  }
}

/** A bound: its decimal text (no sign, no exponent) and whether it is included. */
interface Bound {
  int: string;
  frac: string;
  inclusive: boolean;
}

/** Most integer digits a bounded number may have when one side is open. */
const MAX_INT_DIGITS = 16;
/** Most fraction digits. */
const MAX_FRAC_DIGITS = 16;

/**
 * The decimal digits of |x| without exponent, exactly as its shortest form writes them ("1e-7" →
 * "0.0000001", "1e-300" → "0." and 299 zeros and "1").
 *
 * @example
 * ```ts
 * decimalText(-2.5e-3); // "0.0025"
 * ```
 */
export function decimalText(x: number): string {
  if (!Number.isFinite(x)) throw new Error(`not a finite number: ${x}`);
  const text = Math.abs(x).toString();
  const m = /^(\d+)(?:\.(\d+))?e([+-]\d+)$/.exec(text);
  if (!m) return text;
  const digits = m[1] + (m[2] ?? "");
  // |x| = digits × 10^exp
  const exp = Number(m[3]) - (m[2]?.length ?? 0);
  if (exp >= 0) return digits + "0".repeat(exp);
  const point = digits.length + exp;
  return point > 0 ? `${digits.slice(0, point)}.${digits.slice(point)}` : `0.${"0".repeat(-point)}${digits}`;
}

function bound(x: number, inclusive: boolean): Bound {
  const [int, frac = ""] = decimalText(x).split(".");
  return { int: int.replace(/^0+(?=\d)/, ""), frac: frac.replace(/0+$/, ""), inclusive };
}

const DIGITS = "0123456789";
const cls = (from: number, to: number) => from > to ? "" : from === to ? `"${from}"` : `[${from}-${to}]`;

/**
 * A rule for JSON numbers `x` with lo ≤ x ≤ hi (or strict, per the flags); `integer` allows no fraction.
 * Either side may be open (undefined). Numbers are written without exponent, with at most
 * {@link MAX_INT_DIGITS} digits before the point and {@link MAX_FRAC_DIGITS} after it. Throws when no
 * such number lies in the range (an empty range, or one only numbers of more digits reach).
 *
 * @example
 * ```ts
 * import { GbnfRules } from "./gbnf.ts";
 * const rules = new GbnfRules("");
 * numberRange(rules, "age", { min: 0, max: 150, integer: true });
 * ```
 */
export function numberRange(
  rules: GbnfRules,
  hint: string,
  r: { min?: number; max?: number; exclusiveMin?: boolean; exclusiveMax?: boolean; integer: boolean },
): string {
  let { min, max } = r;
  let exMin = r.exclusiveMin ?? false;
  let exMax = r.exclusiveMax ?? false;
  if (r.integer) {
    // Integer bounds become inclusive integers.
    if (min !== undefined) {
      min = exMin ? Math.floor(min) + 1 : Math.ceil(min);
      exMin = false;
    }
    if (max !== undefined) {
      max = exMax ? Math.ceil(max) - 1 : Math.floor(max);
      exMax = false;
    }
  }
  // Numbers are written with at most 16 integer digits: a bound beyond them holds for all of them.
  if (min !== undefined && min <= -(10 ** MAX_INT_DIGITS)) min = undefined;
  if (max !== undefined && max >= 10 ** MAX_INT_DIGITS) max = undefined;
  if (min !== undefined && max !== undefined && (min > max || (min === max && (exMin || exMax)))) {
    throw new EmptyRangeError();
  }
  const g = new RangeGrammar(rules, hint, r.integer);
  const alts: string[] = [];
  // Negative numbers: "-" then a magnitude in [|max|, |min|] (bounds swap sides).
  if (min === undefined || min < 0) {
    const lo = max === undefined || max > 0 ? { int: "0", frac: "", inclusive: false } : bound(max, !exMax);
    const hi = min === undefined ? undefined : bound(min, !exMin);
    // "-0" is not a negative number: the magnitude must be > 0.
    const positiveLo = lo.int === "0" && lo.frac === "" ? { ...lo, inclusive: false } : lo;
    const body = g.magnitude(positiveLo, hi);
    if (body) alts.push(`"-" ${body}`);
  }
  if (max === undefined || max >= 0) {
    const lo = min === undefined || min < 0 ? { int: "0", frac: "", inclusive: true } : bound(min, !exMin);
    const hi = max === undefined ? undefined : bound(max, !exMax);
    const body = g.magnitude(lo, hi);
    if (body) alts.push(body);
  }
  if (alts.length === 0) throw new EmptyRangeError();
  return rules.add(`${hint}-range`, alts.join(" | "));
}

/** Builds magnitude grammars (digits of |x|) between two bounds. */
class RangeGrammar {
  constructor(readonly rules: GbnfRules, readonly hint: string, readonly integer: boolean) {}

  /** Magnitudes m with lo ≤ m ≤ hi (strict per the bounds' flags); "" when none. */
  magnitude(lo: Bound, hi: Bound | undefined): string {
    const minLen = Math.max(1, lo.int.length);
    const maxLen = hi ? hi.int.length : MAX_INT_DIGITS;
    const alts: string[] = [];
    for (let n = minLen; n <= maxLen; n++) {
      const body = this.#intDigits(
        n,
        0,
        n === lo.int.length ? lo : undefined,
        hi && n === hi.int.length ? hi : undefined,
      );
      if (body) alts.push(body);
    }
    return alts.length === 0 ? "" : this.rules.add(`${this.hint}-mag`, alts.join(" | "));
  }

  /**
   * Integer digits from position `i` of an `n`-digit integer part; `lo`/`hi` are set while the digits
   * so far equal that bound's digits (tight). Returns "" when no continuation exists.
   */
  #intDigits(n: number, i: number, lo: Bound | undefined, hi: Bound | undefined): string {
    if (i === n) return this.#fraction(lo, hi);
    const first = i === 0 ? (n === 1 ? 0 : 1) : 0;
    const low = lo ? Number(lo.int[i]) : first;
    const high = hi ? Number(hi.int[i]) : 9;
    const from = Math.max(first, low);
    if (from > high) return "";
    const alts: string[] = [];
    const freeFrom = lo ? from + (from === low ? 1 : 0) : from;
    const freeTo = hi ? high - 1 : high;
    if (freeFrom <= freeTo) {
      const rest = n - i - 1;
      const tail = `${rest > 0 ? ` [0-9]{${rest}}` : ""}${this.#anyFraction()}`;
      alts.push(`${cls(freeFrom, freeTo)}${tail}`);
    }
    if (lo && hi && low === high) {
      const next = this.#intDigits(n, i + 1, lo, hi);
      if (next) alts.push(`"${low}" ${next}`);
    } else {
      if (lo && low >= first) {
        const next = this.#intDigits(n, i + 1, lo, undefined);
        if (next) alts.push(`"${low}" ${next}`);
      }
      if (hi && high >= first && high >= (lo ? low : first) && !(lo && high === low)) {
        const next = this.#intDigits(n, i + 1, undefined, hi);
        if (next) alts.push(`"${high}" ${next}`);
      }
    }
    return alts.length === 0 ? "" : this.rules.add(`${this.hint}-d`, alts.join(" | "));
  }

  /** Any fraction (or none). */
  #anyFraction(): string {
    return this.integer ? "" : ` ( "." [0-9]{1,${MAX_FRAC_DIGITS}} )?`;
  }

  /** The fraction after an integer part equal to the tight bounds' (`lo`, `hi` as above). */
  #fraction(lo: Bound | undefined, hi: Bound | undefined): string {
    if (!lo && !hi) return this.#anyFraction().trim() || '""';
    if (this.integer) {
      // Integers never have fraction digits; equality with a bound must be allowed.
      if ((lo && (!lo.inclusive || lo.frac !== "")) || (hi && !hi.inclusive)) return "";
      return '""';
    }
    const digits = this.#fracDigits(0, lo, hi);
    // No fraction at all means fraction "0…": allowed when it satisfies both bounds.
    const noneOk = (!lo || (lo.frac === "" && lo.inclusive)) && (!hi || hi.inclusive || hi.frac !== "");
    const alts = [...(digits ? [`"." ${digits}`] : []), ...(noneOk ? ['""'] : [])];
    return alts.length === 0 ? "" : this.rules.add(`${this.hint}-f`, alts.join(" | "));
  }

  /**
   * One or more fraction digits from position `j` (at most MAX_FRAC_DIGITS in all) while tight to the
   * bounds; a missing bound digit is 0. Equality at the end is allowed only for inclusive bounds.
   */
  #fracDigits(j: number, lo: Bound | undefined, hi: Bound | undefined): string {
    if (j >= MAX_FRAC_DIGITS) return "";
    const low = lo ? Number(lo.frac[j] ?? "0") : 0;
    const high = hi ? Number(hi.frac[j] ?? "0") : 9;
    if (low > high) return "";
    const left = MAX_FRAC_DIGITS - j - 1;
    const anyMore = left > 0 ? ` [0-9]{0,${left}}` : "";
    const alts: string[] = [];
    const freeFrom = lo ? low + 1 : low;
    const freeTo = hi ? high - 1 : high;
    if (freeFrom <= freeTo) alts.push(`${cls(freeFrom, freeTo)}${anyMore}`);
    const end = (b: Bound | undefined) => !b || j + 1 >= b.frac.length;
    const tightStep = (l: Bound | undefined, h: Bound | undefined, digit: number) => {
      // Stopping here equals the tight bounds only if their remaining digits are all zero.
      const stop = (!l || (end(l) ? l.inclusive : false)) && (!h || (end(h) ? h.inclusive : true));
      const more = this.#fracDigits(j + 1, l, h);
      const options = [...(stop ? ['""'] : []), ...(more ? [more] : [])];
      if (options.length > 0) {
        alts.push(`"${digit}" ${options.length === 1 ? options[0] : `( ${options.join(" | ")} )`}`);
      }
    };
    if (lo && hi && low === high) tightStep(lo, hi, low);
    else {
      if (lo) tightStep(lo, undefined, low);
      if (hi) tightStep(undefined, hi, high);
    }
    return alts.length === 0 ? "" : this.rules.add(`${this.hint}-fd`, alts.join(" | "));
  }
}

/**
 * A rule for integers that are multiples of `k` (1 ≤ k ≤ 1000), by the remainder automaton over
 * decimal digits; signs allowed.
 *
 * @example
 * ```ts
 * import { GbnfRules } from "./gbnf.ts";
 * multipleOfInteger(new GbnfRules(""), "even", 2);
 * ```
 */
export function multipleOfInteger(rules: GbnfRules, hint: string, k: number): string {
  if (k === 1) return "integer";
  // state r: the digits so far are ≡ r (mod k); digit d moves to (10r + d) mod k.
  const names = Array.from({ length: k }, (_, r) => rules.reserve(`${hint}-m${r}`));
  for (let r = 0; r < k; r++) {
    const byTarget = new Map<number, number[]>();
    for (const d of DIGITS) {
      const to = (10 * r + Number(d)) % k;
      byTarget.set(to, [...(byTarget.get(to) ?? []), Number(d)]);
    }
    const alts = [...byTarget].map(([to, ds]) => `[${ds.join("")}] ${names[to]}`);
    if (r === 0) alts.push('""');
    rules.define(names[r], alts.join(" | "));
  }
  const startAlts: string[] = [];
  for (let d = 1; d <= 9; d++) startAlts.push(`"${d}" ${names[d % k]}`);
  const positive = rules.add(`${hint}-pos`, startAlts.join(" | "));
  return rules.add(`${hint}-mult`, `"0" | "-"? ${positive}`);
}
