/**
 * The grammar plan of a chat job: what constrains its output (forced tool calls in the model's
 * dialect, a `response_format`, calls or the format, a lazy grammar for calls under `auto`), built
 * as GBNF once per distinct input and kept in a bounded cache, then parsed by llama.cpp.
 */
import type { ChatJob, EngineTool } from "../types.ts";
import { EngineInputError } from "../types.ts";
import type { Logger } from "../../log.ts";
import type { NativeModel } from "./native.ts";
import { GrammarConstraint, type GrammarTrigger } from "./grammar.ts";
import {
  AutomatonCache,
  gbnfLiteral,
  GbnfRules,
  GrammarError,
  JsonGrammar,
  LruCache,
  textWithout,
} from "../../grammar/mod.ts";
import type { CallTags, ToolDialect } from "./dialects/index.ts";
import type { ThinkMarkers } from "./template_facts.ts";
import { Slicer } from "../../event_loop.ts";

/** Most tool calls one turn may hold (bounds the grammar's repetition). */
const MAX_PARALLEL_CALLS = 8;
/** Grammars kept by their inputs: at most this many, of at most this many characters in all. */
const GRAMMAR_CACHE = { entries: 256, chars: 64 * 1024 * 1024 };

/** What constrains a job's output: a grammar, nothing, or a refusal (a 400), as built from its inputs. */
type GrammarPlan =
  | { kind: "grammar"; text: string; trigger?: GrammarTrigger; param: string }
  | { kind: "none" }
  | { kind: "refused"; error: EngineInputError };

/**
 * The grammars of one model's chat jobs, by their inputs.
 *
 * @example
 * ```ts
 * import type { ChatJob } from "../types.ts";
 * import type { Logger } from "../../log.ts";
 * import type { NativeModel } from "./native.ts";
 * import { DIALECTS } from "./dialects/index.ts";
 * import { THINK_MARKERS } from "./template_facts.ts";
 * async function grammarOf(model: NativeModel, log: Logger, job: ChatJob, signal: AbortSignal) {
 *   const open = model.tokenize(DIALECTS.json.open, true);
 *   const grammars = new ChatGrammars(model, DIALECTS.json, open, THINK_MARKERS, log);
 *   return await grammars.grammar(job, false, false, signal); // null: nothing constrains the output
 * }
 * ```
 */
export class ChatGrammars {
  readonly dialect: ToolDialect;
  readonly #model: NativeModel;
  readonly #log: Logger;
  readonly #think: ThinkMarkers;
  /** Tokens of the text that opens a tool call (a single token makes the lazy grammar cheap). */
  readonly #openTokens: number[];
  /** The call tags in grammars: the vocabulary's tokens where it has them (see CallTags). */
  readonly #callTags: CallTags;
  /** Grammars by their inputs: each schema is compiled once. */
  readonly #plans = new LruCache<GrammarPlan>(GRAMMAR_CACHE.entries, GRAMMAR_CACHE.chars);
  /** Automata of JSON-schema `pattern`s, shared by every grammar of this model. */
  readonly #automata = new AutomatonCache({ slices: (signal) => new Slicer(3, signal) });

  /** `openTokens`: the tokens of the dialect's opening tag in `model`'s vocabulary. */
  constructor(
    model: NativeModel,
    dialect: ToolDialect,
    openTokens: number[],
    think: ThinkMarkers,
    log: Logger,
  ) {
    this.#model = model;
    this.dialect = dialect;
    this.#think = think;
    this.#log = log;
    this.#openTokens = openTokens;
    const closeTokens = model.tokenize(this.dialect.close, true);
    this.#callTags = {
      open: this.#openTokens.length === 1 ? `<[${this.#openTokens[0]}]>` : gbnfLiteral(this.dialect.open),
      close: closeTokens.length === 1 ? `<[${closeTokens[0]}]>` : gbnfLiteral(this.dialect.close),
    };
  }

  /**
   * The grammar a job needs: forced tool calls, or constrained JSON output; under `auto` a lazy
   * grammar for calls the model opens. With thinking, a reasoning block may precede. Built once per
   * distinct input ({@link #plan}) and parsed by llama.cpp off the event loop.
   */
  async grammar(
    job: ChatJob,
    inThink: boolean,
    thinking: boolean,
    signal: AbortSignal,
  ): Promise<GrammarConstraint | null> {
    const plan = await this.#plan(job, inThink, thinking, signal);
    if (plan.kind === "none") return null;
    if (plan.kind === "refused") throw plan.error;
    const grammar = await GrammarConstraint.parse(this.#model, plan.text, plan.trigger, plan.param);
    if (!grammar) {
      this.#log.error("llama.cpp rejected a generated grammar", { grammar: plan.text.slice(0, 2000) });
      throw new Error("the output grammar could not be built");
    }
    return grammar;
  }

  /**
   * What a job's grammar is, from the cache when the same inputs were seen before (the key is every
   * input the grammar depends on, as JSON: property order is part of it, as it orders the output).
   * Pattern automata are compiled between passes of the (synchronous) build, in slices that leave
   * the event loop free ({@link AutomatonCache.build}).
   */
  async #plan(job: ChatJob, inThink: boolean, thinking: boolean, signal: AbortSignal): Promise<GrammarPlan> {
    const forced = job.toolChoice === "required" || typeof job.toolChoice === "object";
    const mayCall = job.toolChoice === "auto" && job.tools.length > 0;
    // A forced call comes first, whatever the format; under auto a format allows a call or the format.
    const mode = forced
      ? "forced"
      : job.output.type !== "text"
      ? mayCall ? "call_or_output" : "output"
      : mayCall
      ? "auto"
      : undefined;
    if (!mode) return { kind: "none" };
    const key = JSON.stringify([
      mode,
      inThink,
      thinking,
      ...(mode === "output" || mode === "call_or_output" ? [job.output] : []),
      ...(mode === "output" ? [] : [
        job.toolChoice,
        job.parallelToolCalls,
        job.tools.map((t) => [t.name, t.parameters ?? null, t.strict ?? false]),
      ]),
    ]);
    const cached = this.#plans.get(key);
    if (cached) return cached;
    let plan: GrammarPlan;
    try {
      plan = await this.#automata.build(() => this.#buildPlan(job, mode, inThink, thinking), signal);
    } catch (e) {
      const error = e instanceof GrammarError ? toEngineError(e, null) : e;
      if (!(error instanceof EngineInputError)) throw error;
      plan = { kind: "refused", error };
    }
    this.#plans.set(key, plan, key.length + (plan.kind === "grammar" ? plan.text.length : 0));
    return plan;
  }

  /** One synchronous pass of building a job's grammar (see {@link #plan}). */
  #buildPlan(
    job: ChatJob,
    mode: "forced" | "output" | "call_or_output" | "auto",
    inThink: boolean,
    thinking: boolean,
  ): GrammarPlan {
    if (mode === "forced") {
      const tools = typeof job.toolChoice === "object"
        ? job.tools.filter((t) => t.name === (job.toolChoice as { name: string }).name)
        : job.tools;
      return { kind: "grammar", text: this.#callsGrammar(job, tools, inThink, thinking), param: "tools" };
    }
    if (mode === "output" || mode === "call_or_output") {
      const g = new JsonGrammar(new GbnfRules("", this.#automata));
      const param = job.output.type === "json_schema"
        ? "response_format.json_schema.schema"
        : "response_format";
      const payload = withParam(
        param,
        () =>
          job.output.type === "json_schema"
            ? g.schema(job.output.schema, param, "out")
            : g.schema({ type: "object" }, param, "out"),
      );
      const calls = mode === "call_or_output" ? this.#optionalCalls(g, job) : undefined;
      return {
        kind: "grammar",
        param,
        text: g.rules.text(
          `root ::= ${thinkPrefix(g, this.#think, inThink, thinking)}${
            calls ? `( ${calls} | ${payload} )` : payload
          }`,
        ),
      };
    }
    let text: string;
    try {
      text = this.#callsGrammar(job, job.tools, false, false);
    } catch (e) {
      // `strict` promises the schema: a strict tool whose schema cannot be enforced is refused, as is
      // a schema past the work budget, whatever the tool.
      if (!(e instanceof EngineInputError) || job.tools.some((t) => t.strict)) throw e;
      if (e.code === "schema_too_large") throw e;
      // Otherwise `auto` promises no grammar: such calls are parsed from free text instead of failing.
      this.#log.debug("tool calls under auto are not grammar-constrained", { reason: e.message });
      return { kind: "none" };
    }
    const trigger = this.#openTokens.length === 1
      ? { tokens: this.#openTokens, patterns: [] }
      : { tokens: [], patterns: [`[\\s\\S]*?(${escapeRegExp(this.dialect.open)}[\\s\\S]*)`] };
    return { kind: "grammar", text, trigger, param: "tools" };
  }

  /**
   * The calls an `auto` job with a response format may make instead of the format, in `g`; undefined
   * when their schemas cannot be enforced (then only the format is allowed; strict tools are refused).
   */
  #optionalCalls(g: JsonGrammar, job: ChatJob): string | undefined {
    try {
      return this.#callRules(g, job, job.tools);
    } catch (e) {
      if (!(e instanceof EngineInputError) || job.tools.some((t) => t.strict)) throw e;
      this.#log.debug("tool calls are not offered next to the response format", { reason: e.message });
      return undefined;
    }
  }

  /** One call (or, with parallel calls, up to MAX_PARALLEL_CALLS) of the given tools. */
  #callsGrammar(job: ChatJob, tools: EngineTool[], inThink: boolean, thinking: boolean): string {
    const g = new JsonGrammar(new GbnfRules("", this.#automata));
    return g.rules.text(
      `root ::= ${thinkPrefix(g, this.#think, inThink, thinking)}${this.#callRules(g, job, tools)}`,
    );
  }

  /** The call rules of `tools` in `g`: one call, or with parallel calls up to MAX_PARALLEL_CALLS. */
  #callRules(g: JsonGrammar, job: ChatJob, tools: EngineTool[]): string {
    const calls = tools.map((t) => {
      const i = job.tools.indexOf(t);
      const param = `tools[${i}].function.parameters`;
      return withParam(param, () => this.dialect.callRule(g, t, param, `t${i}`, this.#callTags));
    });
    const call = g.rules.add("call", calls.join(" | "));
    const more = job.parallelToolCalls ? ` ( "\\n" ${call} ){0,${MAX_PARALLEL_CALLS - 1}}` : "";
    return `${call}${more}`;
  }
}

/** The reasoning a constrained answer may start with, as a grammar prefix. */
function thinkPrefix(g: JsonGrammar, think: ThinkMarkers, inThink: boolean, thinking: boolean): string {
  if (!thinking && !inThink) return "";
  const reasoning = textWithout(g.rules, "reasoning", [think.close, think.open]);
  const close = `${reasoning} ${gbnfLiteral(think.close)} "\\n"{0,2} `;
  return inThink ? close : `( ${gbnfLiteral(think.open)} ${close})? `;
}

/** Runs `build`; an input error that names no request field is given `param`. */
function withParam<T>(param: string, build: () => T): T {
  try {
    return build();
  } catch (e) {
    if (e instanceof GrammarError) throw toEngineError(e, param);
    if (e instanceof EngineInputError && e.param === null) {
      throw new EngineInputError(e.message, param, e.code);
    }
    throw e;
  }
}

/** A schema the grammar package refused, as the engine reports bad input (a 400 naming `param`). */
function toEngineError(e: GrammarError, param: string | null): EngineInputError {
  return new EngineInputError(e.message, e.param ?? param, e.code);
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
