/**
 * Our chat template for the Qwen3.5/Qwen3.6 format, embedded in the qwen35moe stand-ins as
 * `tokenizer.chat_template`. Written for vserve (not Qwen's text); it reproduces the format:
 *
 * - ChatML turns `<|im_start|>{role}\n…<|im_end|>\n`; a system message may only come first.
 * - Tools: JSON objects inside `<tools>…</tools>` in the system turn (after the system message,
 *   or in a system turn of their own), with how to write a call:
 *   `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n…</function>\n</tool_call>`
 *   (string values raw, others JSON).
 * - Earlier assistant calls are rendered in that form from `function.arguments` as a mapping (a
 *   string, as some clients send, is written as it is), after the turn's content.
 * - Tool results (`role: tool`) go into a user turn as `<tool_response>\n…\n</tool_response>`
 *   blocks; consecutive results share one turn.
 * - Thinking: the generation prompt opens `<think>\n` (on by default); `enable_thinking=false`
 *   gives an empty, closed `<think>\n\n</think>\n\n`. Assistant turns after the last real user
 *   query (a user message that is not a tool response) keep their reasoning (`reasoning_content`,
 *   `reasoning`, or a `<think>…</think>` prefix of the content) as `<think>\n…\n</think>\n\n`
 *   (an empty one when there is none, as the thinking-off prompt wrote it); earlier turns keep
 *   only their content.
 * - Errors (`raise_exception`): a system message that is not first, no user query, an unknown
 *   role.
 *
 * It renders the same in @huggingface/jinja and in llama.cpp's Jinja engine (tests check both).
 * String.raw keeps `\n` escapes for Jinja's own string literals.
 */
export const QWEN35_CHAT_TEMPLATE = String
  .raw`{#- vserve chat template, Qwen3.5/Qwen3.6 format (see src/models/qwen35_chat_template.ts) -#}
{%- macro as_text(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part.text is defined and part.text is string -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- elif content is defined and content is not none -%}
        {{- content | string -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro is_tool_response(text) -%}
    {%- if text.startswith('<tool_response>') and text.endswith('</tool_response>') -%}yes{%- endif -%}
{%- endmacro -%}
{%- if not messages -%}
    {{- raise_exception('The conversation has no messages.') -}}
{%- endif -%}
{%- set state = namespace(last_query=-1) -%}
{%- for message in messages -%}
    {%- if message.role == 'system' and not loop.first -%}
        {{- raise_exception('A system message may only be the first message.') -}}
    {%- endif -%}
    {%- if message.role not in ['system', 'user', 'assistant', 'tool'] -%}
        {{- raise_exception('Unknown message role: ' + (message.role | string)) -}}
    {%- endif -%}
    {%- if message.role == 'user' and not is_tool_response(as_text(message.content)) -%}
        {%- set state.last_query = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- if state.last_query < 0 -%}
    {{- raise_exception('The conversation has no user query.') -}}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0].role == 'system' -%}
        {%- set system_text = as_text(messages[0].content) -%}
        {%- if system_text -%}
            {{- system_text + '\n\n' -}}
        {%- endif -%}
    {%- endif -%}
    {{- '# Tools\n\nThese functions are available to you. Each is described by one JSON object:\n\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\n' -}}
    {{- 'To call a function, reply with a block in exactly this form:\n\n' -}}
    {{- '<tool_call>\n<function=NAME_OF_THE_FUNCTION>\n<parameter=NAME_OF_A_PARAMETER>\nVALUE\n</parameter>\n' -}}
    {{- '<parameter=NAME_OF_ANOTHER_PARAMETER>\nVALUE\n</parameter>\n</function>\n</tool_call>\n\n' -}}
    {{- 'Rules:\n' -}}
    {{- '- Give every required parameter, each in its own <parameter=...> element.\n' -}}
    {{- '- Write a string value as plain text; write any other value (number, boolean, array, object) as JSON.\n' -}}
    {{- '- To call several functions, write one <tool_call> block after another.\n' -}}
    {{- '- You may write a short reply before your calls, but nothing after them.\n' -}}
    {{- '- Call a function only when it helps; otherwise answer directly.' -}}
    {{- '<|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
    {{- '<|im_start|>system\n' + as_text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- set content = as_text(message.content) -%}
    {%- if message.role == 'user' -%}
        {{- '<|im_start|>user\n' + content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set reasoning = '' -%}
        {%- if '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
            {%- set content = content.split('</think>')[-1] -%}
        {%- endif -%}
        {%- if message.reasoning_content is defined and message.reasoning_content is string and message.reasoning_content -%}
            {%- set reasoning = message.reasoning_content -%}
        {%- elif message.reasoning is defined and message.reasoning is string and message.reasoning -%}
            {%- set reasoning = message.reasoning -%}
        {%- endif -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if loop.index0 > state.last_query -%}
            {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
        {%- else -%}
            {{- content.lstrip('\n') -}}
        {%- endif -%}
        {%- if message.tool_calls is defined and message.tool_calls -%}
            {%- for call in message.tool_calls -%}
                {%- set function = call.function if call.function is defined else call -%}
                {%- if loop.first -%}
                    {%- if content.strip() -%}
                        {{- '\n\n' -}}
                    {%- endif -%}
                {%- else -%}
                    {{- '\n' -}}
                {%- endif -%}
                {{- '<tool_call>\n<function=' + function.name + '>\n' -}}
                {%- if function.arguments is mapping -%}
                    {%- for key, value in function.arguments | items -%}
                        {{- '<parameter=' + key + '>\n' -}}
                        {%- if value is string -%}
                            {{- value -}}
                        {%- else -%}
                            {{- value | tojson -}}
                        {%- endif -%}
                        {{- '\n</parameter>\n' -}}
                    {%- endfor -%}
                {%- elif function.arguments is string -%}
                    {{- function.arguments + '\n' -}}
                {%- endif -%}
                {{- '</function>\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and not enable_thinking -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- else -%}
        {{- '<think>\n' -}}
    {%- endif -%}
{%- endif -%}
`;
