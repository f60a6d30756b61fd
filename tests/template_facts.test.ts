/**
 * Unit tests of what the chat engine reads from a chat template (template_facts.ts): the token a
 * turn opens with (where recurrent-state checkpoints go), the thinking switch, the dialect.
 */
import assert from "node:assert/strict";
import { readTemplateFacts } from "../src/engines/llama/template_facts.ts";
import { TemplateRenderer } from "../src/engines/llama/template_render.ts";
import { QWEN35_CHAT_TEMPLATE } from "../src/models/qwen35_chat_template.ts";
import { loadQwen3Vocab } from "../src/models/qwen3_vocab.ts";
import type { MarkupToken } from "../src/engines/markup.ts";

/** The stand-ins' vocabulary's markup: its control and user-defined tokens (as llama.cpp types them). */
async function qwen3Markup(): Promise<MarkupToken[]> {
  const vocab = await loadQwen3Vocab();
  const markup: MarkupToken[] = [];
  vocab.tokenTypes.forEach((type, id) => {
    if (type === 3 || type === 4) markup.push({ text: vocab.tokens[id], id, matchedInText: type === 4 });
  });
  return markup;
}

function template(source: string, markup: MarkupToken[]): TemplateRenderer {
  return new TemplateRenderer({ source, specials: { bos: "", eos: "" }, markup });
}

Deno.test("template facts: the Qwen3.6 stand-in opens turns with <|im_start|>, thinks by default, speaks XML", async () => {
  const markup = await qwen3Markup();
  const facts = readTemplateFacts(template(QWEN35_CHAT_TEMPLATE, markup));
  assert.deepEqual(facts.turnStart, { id: 151644, text: "<|im_start|>" });
  assert.deepEqual(facts.thinking, { switchable: true, defaultOn: true });
  assert.deepEqual(facts.think, { open: "<think>", close: "</think>" });
  assert.equal(facts.dialect.name, "xml");
});

Deno.test("template facts: the Qwen3 stand-in's own template opens turns with <|im_start|>, speaks JSON", async () => {
  const vocab = await loadQwen3Vocab();
  const facts = readTemplateFacts(template(vocab.chatTemplate, await qwen3Markup()));
  assert.deepEqual(facts.turnStart, { id: 151644, text: "<|im_start|>" });
  assert.equal(facts.thinking.switchable, true);
  assert.equal(facts.dialect.name, "json");
});

Deno.test("template facts: a template without <|im_start|> gives the token it opens turns with", () => {
  const gemma =
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n" +
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";
  const llama3 = "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n" +
    "{{ m.content }}<|eot_id|>{% endfor %}" +
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
  // <|im_start|> is in the vocabulary but not in these templates: it is not their turn marker.
  const markup = [
    { text: "<|im_start|>", id: 5, matchedInText: false },
    { text: "<start_of_turn>", id: 106, matchedInText: false },
    { text: "<end_of_turn>", id: 107, matchedInText: false },
    { text: "<|start_header_id|>", id: 128006, matchedInText: false },
    { text: "<|end_header_id|>", id: 128007, matchedInText: false },
    { text: "<|eot_id|>", id: 128009, matchedInText: false },
  ];
  assert.deepEqual(readTemplateFacts(template(gemma, markup)).turnStart, {
    id: 106,
    text: "<start_of_turn>",
  });
  assert.deepEqual(readTemplateFacts(template(llama3, markup)).turnStart, {
    id: 128006,
    text: "<|start_header_id|>",
  });
});

Deno.test("template facts: a template whose turns open with no markup token gives none, and no error", () => {
  const markup = [{ text: "<|im_start|>", id: 5, matchedInText: false }];
  const plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}" +
    "{% if add_generation_prompt %}assistant: {% endif %}";
  const facts = readTemplateFacts(template(plain, markup));
  assert.equal(facts.turnStart, null);
  assert.deepEqual(facts.thinking, { switchable: false, defaultOn: false });
  assert.equal(facts.dialect.name, "json");
  // A template that cannot render the probe has no facts to give, and does not throw.
  const broken = readTemplateFacts(template("{{ raise_exception('no') }}", markup));
  assert.equal(broken.turnStart, null);
});
