/** The error every compiler of this package throws for a schema or pattern it will not compile. */

/**
 * Why a schema is refused: `invalid_schema` (no value could satisfy it, or a keyword's value is of
 * the wrong kind), `unsupported_schema` (valid, but no grammar can enforce it), `schema_too_large`
 * (compiling it would take more work than the budget allows).
 */
export type GrammarErrorCode = "invalid_schema" | "unsupported_schema" | "schema_too_large";

/**
 * A schema or pattern refused, with what and where: `param` is the caller's name for the schema
 * (e.g. the request field it came in), `path` the JSON pointer inside it, `keyword` the keyword at
 * fault, when known.
 *
 * @example
 * ```ts
 * function refuseMinLength(): never {
 *   throw new GrammarError("The JSON schema keyword 'minLength' at #/properties/a is too large.", {
 *     code: "unsupported_schema",
 *     keyword: "minLength",
 *     path: "#/properties/a",
 *   });
 * }
 * ```
 */
export class GrammarError extends Error {
  override name = "GrammarError";
  readonly code: GrammarErrorCode;
  readonly param: string | null;
  readonly path?: string;
  readonly keyword?: string;

  constructor(
    message: string,
    opts: { code: GrammarErrorCode; param?: string | null; path?: string; keyword?: string },
  ) {
    super(message);
    this.code = opts.code;
    this.param = opts.param ?? null;
    this.path = opts.path;
    this.keyword = opts.keyword;
  }

  /** The same error under the caller's name for the schema (when it has none yet). */
  withParam(param: string): GrammarError {
    if (this.param !== null) return this;
    return new GrammarError(this.message, {
      code: this.code,
      param,
      path: this.path,
      keyword: this.keyword,
    });
  }
}
