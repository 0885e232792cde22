"""The api-server's REST API, as the harness calls it: a JWT, then JSON requests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from airflow_pg_bulk.demo.harness.results import AirflowRunnerError


class RestClient:
    """JSON requests to ``base_url`` with a bearer token fetched (and refreshed) on demand.

    :param home: the ``AIRFLOW_HOME``, where SimpleAuthManager writes generated passwords.
    :param env: the Airflow processes' environment (it may name another passwords file).
    """

    def __init__(self, base_url: str, home: Path, env: dict[str, str]) -> None:
        self.base_url = base_url
        self.home = home
        self.env = env
        self.token: str | None = None

    def fetch_token(self) -> str:
        """JWT for the REST API: all-admins token, else login with the generated password."""
        try:
            data = self.request("GET", "/auth/token", auth=False)
        except AirflowRunnerError as err:
            # The caller turned simple_auth_manager_all_admins off: use the password
            # file that SimpleAuthManager generates in AIRFLOW_HOME.
            pw_file = Path(
                self.env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")
                or self.home / "simple_auth_manager_passwords.json.generated"
            )
            try:
                username, password = next(iter(json.loads(pw_file.read_text()).items()))
            except (OSError, ValueError, StopIteration):
                raise err from None
            data = self.request(
                "POST", "/auth/token", {"username": username, "password": password}, auth=False
            )
        token = data.get("access_token") if isinstance(data, dict) else None
        if not token:
            raise AirflowRunnerError(f"no access_token from /auth/token: {data!r}")
        return str(token)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        auth: bool = True,
        timeout: float = 30,
        _retry_auth: bool = True,
    ) -> Any:
        """Call the api-server and return the decoded JSON response."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if auth:
            if self.token is None:
                self.token = self.fetch_token()
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(
            self.base_url + path, data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode("utf-8", "replace")
            if err.code == 401 and auth and _retry_auth:
                self.token = None
                return self.request(
                    method, path, body, auth=auth, timeout=timeout, _retry_auth=False
                )
            raise AirflowRunnerError(f"{method} {path} -> HTTP {err.code}: {detail}") from err
        return json.loads(raw) if raw else None
