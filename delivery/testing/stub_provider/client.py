"""``StubClient``: the control API of a stub running elsewhere (another process), over HTTP."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import httpx

__all__ = ["StubClient"]


class StubClient:
    """The control API of a stub running elsewhere (another process), over HTTP."""

    def __init__(self, url: str) -> None:
        import httpx

        self.url = url.rstrip("/")
        self._http: httpx.Client = httpx.Client(base_url=self.url, timeout=10.0)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> StubClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code == 400:
            raise ValueError(response.json().get("message", response.text))
        response.raise_for_status()
        return response.json()

    def set_faults(self, **faults: Any) -> dict[str, Any]:
        """Merge ``faults`` into the stub's faults and return them all; ValueError if bad."""
        return cast(dict[str, Any], self._json(self._http.put("/_stub/faults", json=faults)))

    def faults(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(self._http.get("/_stub/faults")))

    def set_receipts(self, **knobs: Any) -> dict[str, Any]:
        """Merge ``knobs`` into the stub's receipts' config and return it; ValueError if bad."""
        return cast(dict[str, Any], self._json(self._http.put("/_stub/receipts", json=knobs)))

    def receipts(self) -> dict[str, Any]:
        """``{"config": {...}, "sent": [...]}``: the receipts' config and log."""
        return cast(dict[str, Any], self._json(self._http.get("/_stub/receipts")))

    def reset(self) -> None:
        self._json(self._http.post("/_stub/reset"))

    def effects(self) -> dict[str, int]:
        return cast(dict[str, int], self._json(self._http.get("/_stub/effects"))["effects"])

    def requests(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self._json(self._http.get("/_stub/requests"))["requests"])

    def health(self) -> bool:
        """True when the stub answers its health check; False if it is unreachable."""
        import httpx

        try:
            response = self._http.get("/_stub/health")
        except httpx.TransportError:
            return False
        return response.status_code == 200 and response.json().get("ok") is True
