"""Chat templates of the two tool-calling families envforge parses, as Jinja strings.

``HERMES`` is Qwen2.5's template (tools in the system turn inside ``<tools></tools>``, calls as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, tool results as a user turn of
``<tool_response>`` blocks). ``LLAMA3`` follows Llama 3.1's JSON tool calling (tools in the first
user turn, a call as ``{"name": ..., "parameters": {...}}``, results in an ``ipython`` turn); unlike
Meta's template, which refuses more than one call per turn, it writes several separated by ``; ``.
Real checkpoints ship their own template in ``tokenizer_config.json``; these are for the small
local models made by ``trainers.tiny`` and for the tests.
"""

_HERMES_TURNS = (
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

HERMES = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
) + _HERMES_TURNS


#: ``HERMES`` without the tool list in the system turn: for small local models that learnt their
#: tools by fine-tuning (the demo's), whose context would otherwise be mostly tool schemas. Calls
#: and tool results are written exactly as ``HERMES`` writes them, so the hermes parser applies.
HERMES_COMPACT = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
) + _HERMES_TURNS

LLAMA3 = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}"
    "{%- if tools and loop.first %}"
    "{{- 'Given the following functions, please respond with a JSON for a function call with its '"
    " 'proper arguments that best answers the given prompt.\\n\\nRespond in the format {\"name\": '"
    " 'function name, \"parameters\": dictionary of argument name and its value}.Do not use '"
    " 'variables.\\n\\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}{%- endif %}"
    "{{- message.content + '<|eot_id|>' }}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if not loop.first %}{{- '; ' }}{%- endif %}"
    "{{- '{\"name\": \"' + tool_call.name + '\", \"parameters\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}' }}{%- endfor %}{{- '<|eot_id|>' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- elif message.role == 'tool' or message.role == 'ipython' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

#: family -> (template, special tokens, end-of-turn token, bos token or None)
CHAT_FORMATS = {
    "hermes": (HERMES, ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                        "<tool_response>", "</tool_response>"], "<|im_end|>", None),
    "llama3": (LLAMA3, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                        "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
               "<|eot_id|>", "<|begin_of_text|>"),
}
