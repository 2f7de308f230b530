// openai_constrain.mjs — constrained decoding through the official openai package (docs/SERVING.md "Constrained
// decoding"): tool_choice "required" gives a tool call, a named function gives that function (one the fixture never
// learnt to call), a strict json_schema answer parses and validates, a streamed one too, and a schema outside the
// subset is a BadRequestError naming its path.
import { openai, ok, check, noControl, done, MODEL, CALCULATOR, QUESTION } from "./lib.mjs";

const client = openai();
const OpenAI = client.constructor;
const ECHO = {
    type: "function",
    function: {
        name: "echo",
        description: "Repeat a text",
        parameters: { type: "object", properties: { text: { type: "string" }, times: { type: "integer" } },
            required: ["text", "times"], additionalProperties: false },
    },
};
const ask = { model: MODEL, messages: [{ role: "user", content: QUESTION }], tools: [CALCULATOR, ECHO], temperature: 1 };

function args(tc) {
    try {
        return JSON.parse(tc?.function?.arguments ?? "");
    } catch {
        return null;
    }
}

await check("tool_choice required", async () => {
    for (const seed of [1, 2, 3]) {
        const r = await client.chat.completions.create({ ...ask, seed, tool_choice: "required" });
        noControl(r, "tool_choice required");
        const c = r.choices[0], calls = c.message.tool_calls ?? [];
        ok(`tool_choice required (seed ${seed}): a tool call, finish_reason tool_calls`,
            calls.length >= 1 && c.finish_reason === "tool_calls", c);
        ok(`tool_choice required (seed ${seed}): calls of the given tools with their arguments`, calls.every((tc) => {
            const a = args(tc);
            return tc.type === "function" && typeof tc.id === "string" && a !== null
                && (tc.function.name === "calculator" ? typeof a.expression === "string"
                    : tc.function.name === "echo" && typeof a.text === "string" && Number.isInteger(a.times));
        }), calls);
    }
});

await check("named function", async () => {
    for (const seed of [4, 5]) {
        const r = await client.chat.completions.create({ ...ask, seed,
            tool_choice: { type: "function", function: { name: "echo" } }, parallel_tool_calls: false });
        noControl(r, "named function");
        const calls = r.choices[0].message.tool_calls ?? [];
        const a = args(calls[0]);
        ok(`named function (seed ${seed}): exactly one echo call with its arguments`, calls.length === 1
            && calls[0].function.name === "echo" && typeof a?.text === "string" && Number.isInteger(a?.times)
            && Object.keys(a).length === 2, r.choices[0].message);
    }
});

const SCHEMA = {
    type: "object",
    properties: { answer: { type: "integer" }, unit: { enum: ["none", "apples"] }, note: { type: ["string", "null"] } },
    required: ["answer", "unit", "note"],
    additionalProperties: false,
};
const validates = (v) => v !== null && typeof v === "object" && !Array.isArray(v)
    && Object.keys(v).sort().join() === "answer,note,unit" && Number.isInteger(v.answer)
    && ["none", "apples"].includes(v.unit) && (v.note === null || typeof v.note === "string");
const asJson = (s) => {
    try {
        return JSON.parse(s);
    } catch {
        return null;
    }
};
const strict = { type: "json_schema", json_schema: { name: "answer", strict: true, schema: SCHEMA } };

await check("strict json_schema", async () => {
    for (const seed of [6, 7, 8]) {
        const r = await client.chat.completions.create({ model: MODEL, seed, temperature: 1,
            messages: [{ role: "user", content: QUESTION }], response_format: strict });
        noControl(r, "strict json_schema");
        const c = r.choices[0];
        ok(`strict json_schema (seed ${seed}): the content parses and validates`,
            validates(asJson(c.message.content)) && c.finish_reason === "stop" && !c.message.tool_calls?.length, c);
    }
    const s = await client.chat.completions.create({ model: MODEL, seed: 9, temperature: 1, stream: true,
        messages: [{ role: "user", content: QUESTION }], response_format: strict });
    let text = "";
    for await (const ch of s) {
        noControl(ch, "strict json_schema chunk");
        text += ch.choices[0]?.delta?.content ?? "";
    }
    ok("strict json_schema streamed: the deltas add up to a valid answer", validates(asJson(text)), text);
});

await check("unsupported schema", async () => {
    try {
        const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "x" }],
            response_format: { type: "json_schema", json_schema: { name: "a", strict: true,
                schema: { type: "object", properties: { a: { type: "string", format: "email" } } } } } });
        ok("unsupported schema is refused", false, r);
    } catch (e) {
        noControl({ message: e.message, error: e.error }, "unsupported schema");
        ok("unsupported schema: BadRequestError 400 naming the path", e instanceof OpenAI.BadRequestError
            && e.status === 400 && e.error?.message?.includes("/properties/a/format")
            && e.error?.param === "response_format", `${e?.constructor?.name} ${e?.status} ${e?.message}`);
    }
});

done();
