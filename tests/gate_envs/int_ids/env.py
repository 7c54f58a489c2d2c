"""Capability: precondition verification.

Why it transfers: an agent must check an order's status before cancelling it; shipped orders
cannot be cancelled and the agent must say so. Orders are numbered with integers.
"""
import json
import random
import re

CAPABILITY = "precondition verification"
SKILLS = {"status_check": 1.0}

TOOLS = [
    {"type": "function", "function": {
        "name": "find_customer_orders",
        "description": "Find a customer's orders by their email; returns order ids and item names.",
        "parameters": {"type": "object", "properties": {"email": {"type": "string"}},
                       "required": ["email"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_order_details",
        "description": "Get an order: its item, status and owner.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}},
                       "required": ["order_id"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "cancel_order",
        "description": "Cancel a pending order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}},
                       "required": ["order_id"], "additionalProperties": False}}},
]
POLICY = "You are a shop assistant. Only pending orders can be cancelled; check the status first."
ITEMS = ["kettle", "lamp", "chair", "blender", "desk", "mirror", "rug", "toaster", "clock", "vase",
         "fan", "heater", "shelf", "stool", "pillow"]
NAMES = ["ana", "ben", "chloe", "dev", "eli", "fay", "gus", "hal", "ivy", "jon", "kim", "lea"]
REFUSE = r"can ?not|can't|unable|not possible|unfortunately|won't be able"


def _build(rng):
    email = "{}.{}@shop.example".format(rng.choice(NAMES), rng.choice(NAMES))
    items = rng.sample(ITEMS, rng.randint(2, 4))
    orders = {}
    for it in items:
        oid = rng.randint(100000, 999999)
        orders[oid] = {"order_id": oid, "item": it, "status": rng.choice(["pending", "shipped", "delivered"]),
                       "email": email}
    target = rng.choice(list(orders))
    blocked = rng.random() < 0.5
    orders[target]["status"] = "shipped" if blocked else "pending"
    return {"email": email, "orders": orders, "target": target, "blocked": blocked}


class Env:
    tools = TOOLS
    max_turns = 10

    def reset(self, seed):
        self._w = _build(random.Random(seed))
        self._turn, self._idle, self._read, self._done = 0, 0, False, False
        w = self._w
        self._opening = "Hi, I'm {}. Please cancel my order for the {}.".format(
            w["email"], w["orders"][w["target"]]["item"])
        return {"messages": [{"role": "system", "content": POLICY},
                             {"role": "user", "content": self._opening}]}, {"skill": "status_check"}

    def step(self, action):
        if self._done:
            return {"messages": []}, 0.0, True, False, {"skill": "status_check"}
        self._turn += 1
        msgs, outcome = [], None
        calls = action.get("tool_calls") if isinstance(action, dict) else None
        if isinstance(action, dict) and not calls:
            text = action.get("content") if isinstance(action.get("content"), str) else ""
            reply, outcome = self._reply(text.lower())
            msgs.append({"role": "user", "content": reply})
        elif isinstance(calls, list):
            for i, c in enumerate(calls):
                cid = c.get("id") if isinstance(c, dict) and isinstance(c.get("id"), str) else ""
                if i > 0 or outcome is not None:
                    msgs.append({"role": "tool", "tool_call_id": cid, "content": "Error: one call at a time."})
                    continue
                text, outcome = self._run(c)
                msgs.append({"role": "tool", "tool_call_id": cid, "content": text})
        else:
            msgs.append({"role": "tool", "tool_call_id": "", "content": "Error: bad action."})
        term = outcome is not None
        trunc = not term and self._turn >= self.max_turns
        reward = 0.0
        if term or trunc:
            self._done = True
            reward = self._score(outcome or "none")
        return {"messages": msgs}, reward, term, trunc, {"skill": "status_check"}

    def _run(self, c):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or fn.get("name") not in [t["function"]["name"] for t in TOOLS]:
            return "Error: unknown tool.", None
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except (TypeError, ValueError, RecursionError):
            return "Error: arguments are not JSON.", None
        if not isinstance(args, dict):
            return "Error: arguments must be an object.", None
        name, w = fn["name"], self._w
        if name == "find_customer_orders":
            if not isinstance(args.get("email"), str):
                return "Error: email must be a string.", None
            if args["email"].strip().lower() != w["email"]:
                return "Error: no customer has that email.", None
            return json.dumps([{"order_id": o["order_id"], "item": o["item"]} for o in w["orders"].values()]), None
        oid = args.get("order_id")
        if not isinstance(oid, int) or isinstance(oid, bool):
            return "Error: order_id must be an integer.", None
        order = w["orders"].get(oid)
        if order is None:
            return "Error: order {} not found.".format(oid), None
        if name == "get_order_details":
            self._read = self._read or oid == w["target"]
            return json.dumps(order), None
        order_ok = oid == w["target"] and not w["blocked"]
        order["status"] = "cancelled"
        return "Order {} cancelled.".format(oid), ("right" if order_ok else "wrong")

    def _reply(self, text):
        w = self._w
        if re.search(REFUSE, text):
            if w["blocked"] and "shipped" in text:
                return "I see. Thanks.", "refused"
            return "That's not right. Bye.", "wrong"
        self._idle += 1
        if self._idle >= 4:
            return "I'll come back later.", "left"
        return "As I said: " + self._opening, None

    def _score(self, outcome):
        read = 0.3 if self._read else 0.0
        if outcome == "right" or outcome == "refused":
            return read + 0.7
        if outcome == "wrong":
            return min(read, 0.1)
        return 0.0

    def solve(self, seed):
        w = _build(random.Random(seed))
        call = lambda i, n, a: {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_{}".format(i), "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}]}
        out = [call(0, "find_customer_orders", {"email": w["email"]}),
               call(1, "get_order_details", {"order_id": w["target"]})]
        if w["blocked"]:
            out.append({"role": "assistant", "content": "Unfortunately order {} has already shipped, so I can't cancel it.".format(w["target"])})
        else:
            out.append(call(2, "cancel_order", {"order_id": w["target"]}))
        return out
