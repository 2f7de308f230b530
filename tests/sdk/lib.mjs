// lib.mjs — the helpers every tests/sdk/NAME.mjs uses (docs/SERVING.md "Client compatibility"): the official clients
// pointed at the server under test (K3C_URL, K3C_KEY, K3C_MODEL; packages from K3C_NPM, build/npm/node_modules), the
// ok / FAIL lines that tests/test_sdk.c counts, and the check that no chat control token reaches a client as text.
import { createRequire } from "node:module";
import path from "node:path";

const npm = process.env.K3C_NPM;
const require = createRequire(path.join(npm ?? ".", "k3c-sdk-tests.cjs"));
// A package (or one of its subpaths, e.g. "@anthropic-ai/sdk/helpers/beta/json-schema") from K3C_NPM.
export const load = (name) => {
    const m = require(name);
    return m.default ?? m;
};
export const URL = process.env.K3C_URL;
export const KEY = process.env.K3C_KEY;
export const MODEL = process.env.K3C_MODEL;

// The fixture's one learnt conversation (tests/test_sdk.c CONVERSATION): the calculator tool and the question.
export const CALCULATOR = {
    type: "function",
    function: {
        name: "calculator",
        description: "Evaluate an arithmetic expression",
        parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] },
    },
};
// An OpenAI tool call of the calculator with an id and a JSON `expression` string.
export function isCalculatorCall(tc) {
    let args = null;
    try {
        args = JSON.parse(tc?.function?.arguments ?? "");
    } catch {}
    return tc?.type === "function" && tc.function.name === "calculator" && typeof tc.id === "string"
        && tc.id.length > 0 && typeof args?.expression === "string";
}

export const QUESTION = "What is 6 times 7?";
export const ANSWER = "The answer is 42.";

export function openai(opts = {}) {
    const OpenAI = load("openai");
    return new OpenAI({ baseURL: URL, apiKey: KEY, maxRetries: 0, timeout: 120000, ...opts });
}

export function anthropic(opts = {}) {
    const Anthropic = load("@anthropic-ai/sdk");
    return new Anthropic({ baseURL: URL.replace(/\/v1$/, ""), apiKey: KEY, maxRetries: 0, timeout: 120000, ...opts });
}

let failed = 0;
export function ok(name, cond, detail = "") {
    if (cond) console.log(`ok ${name}`);
    else {
        failed++;
        const d = typeof detail === "string" ? detail : JSON.stringify(detail);
        console.log(`FAIL ${name}: ${d.replace(/\n/g, "\\n").slice(0, 2000)}`);
    }
    return !!cond;
}

// Runs one async case; an exception is its failure, so a file always reaches done().
export async function check(name, fn) {
    try {
        await fn();
    } catch (e) {
        ok(name, false, `threw ${e?.constructor?.name}: ${e?.message}`);
    }
}

const CONTROL = /<\|[A-Za-z_]+\|>/;
let controlSeen = 0, controlChecked = 0;
// Every string of x (recursively) free of chat control tokens; counted, and reported once by done(). `logprobs` is
// not text of the answer: it names every sampled token, markup included (docs/SERVING.md "Client compatibility").
export function noControl(x, where = "response") {
    const bad = [];
    const walk = (v, at) => {
        if (typeof v === "string") {
            if (CONTROL.test(v)) bad.push(`${at}: ${JSON.stringify(v).slice(0, 200)}`);
        } else if (Array.isArray(v)) v.forEach((e, i) => walk(e, `${at}[${i}]`));
        else if (v && typeof v === "object")
            for (const k of Object.keys(v)) if (k !== "logprobs") walk(v[k], `${at}.${k}`);
    };
    walk(x, where);
    controlChecked++;
    if (bad.length) {
        controlSeen++;
        ok(`no control token in ${where}`, false, bad.join("; "));
    }
    return bad.length === 0;
}

// fn must throw an SDK error of class cls with HTTP status; bodyOk(e.error) checks the error body the API defines.
export async function expectError(name, cls, status, fn, bodyOk) {
    try {
        const r = await fn();
        ok(name, false, `no error: ${JSON.stringify(r).slice(0, 300)}`);
    } catch (e) {
        noControl({ message: e.message, error: e.error }, name);
        ok(name, e instanceof cls && e.status === status, `${e?.constructor?.name} ${e?.status} ${e?.message}`);
        ok(`${name}: error body`, bodyOk(e.error), e.error);
    }
}

export function done() {
    ok(`no control token in any of ${controlChecked} responses and chunks`, controlSeen === 0 && controlChecked > 0,
       `${controlSeen} had one`);
    process.exitCode = 0;
}
