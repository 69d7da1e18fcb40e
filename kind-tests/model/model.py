"""The kind test's model: a Messages API endpoint (POST /v1/messages) that
asks for one bash call per turn and ends the turn once its result is back.
It refuses a request without the key the chart hands the api from its
Secret (api.model.existingSecret), so a wrongly wired key fails the test.
Standard library only; run by kind-tests/run.sh from a ConfigMap."""

import http.server
import json
import os
import uuid

COMMAND = "echo e2e-model-bash-ok"


def reply(content, stop_reason):
    return {
        "id": f"msg_{uuid.uuid4().hex[:12]}",
        "type": "message",
        "role": "assistant",
        "model": "e2e-model",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def answer(body):
    last = (body.get("messages") or [{}])[-1]
    blocks = last.get("content") if isinstance(last.get("content"), list) else []
    if any(b.get("type") == "tool_result" for b in blocks):
        return reply([{"type": "text", "text": "done"}], "end_turn")
    call = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", "name": "bash",
            "input": {"command": COMMAND}}
    return reply([{"type": "text", "text": "one bash call"}, call], "tool_use")


class Handler(http.server.BaseHTTPRequestHandler):
    def send(self, status, body):
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):  # noqa: N802 - the readiness probe
        self.send(200, {"ok": True})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        if self.headers.get("x-api-key") != os.environ["MODEL_API_KEY"]:
            self.send(401, {"type": "error", "error": {"type": "authentication_error", "message": "wrong key"}})
        elif self.path != "/v1/messages":
            self.send(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})
        else:
            self.send(200, answer(body))


if __name__ == "__main__":
    http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
