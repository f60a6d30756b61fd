/**
 * The client packages the client-matrix tests drive, pinned here and only here: they are test-only,
 * so they stay out of the main import map (`openai` comes from tests/deno.json, as other tests use it
 * too; `zod` from the main one, the server's own).
 */
export {
  Agent,
  OpenAIChatCompletionsModel,
  OpenAIResponsesModel,
  run,
  setTracingDisabled,
  tool as agentTool,
} from "npm:@openai/agents@0.20.0";
export { generateText, Output, tool as aiTool } from "npm:ai@7.0.173";
export { createOpenAICompatible } from "npm:@ai-sdk/openai-compatible@3.0.92";
export { createOpenAI } from "npm:@ai-sdk/openai@4.0.118";
export { ChatOpenAI } from "npm:@langchain/openai@1.6.0";
export { tool as langchainTool } from "npm:@langchain/core@1.4.0/tools";
// Not a client, but test-only too: the property-based schema test's generator.
export { default as fc } from "npm:fast-check@4.11.0";
