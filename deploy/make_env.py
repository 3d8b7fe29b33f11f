"""Write the environment folder of docker-compose.yml with fresh random passwords.

    python deploy/make_env.py /etc/delivery/env      # then:
    DELIVERY_ENV_DIR=/etc/delivery/env docker-compose up -d --build

It copies ``deploy/env.example/`` and replaces each placeholder: the PostgreSQL password (in
postgres.env and in the URLs of database.env and app.env), the Redis password (redis.env and
the URLs of broker.env), Flower's (``ops:<random>``), the console operator's
(``ops:<random>`` in console.env) and the receipts' signing secret (a random ``whsec_`` one in
receipts.env). Files are created readable by their
owner only; an existing folder is refused (nothing is overwritten). Provider secrets are yours
to add to providers.env.
"""

from __future__ import annotations

import base64
import secrets
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent / "env.example"


def fill(text: str, postgres: str, redis: str, flower: str, console: str, receipts: str) -> str:
    """One example file with its placeholders replaced."""
    return (
        text.replace("delivery:change-me@", f"delivery:{postgres}@")
        .replace("POSTGRES_PASSWORD=change-me", f"POSTGRES_PASSWORD={postgres}")
        .replace("redis://:change-me@", f"redis://:{redis}@")
        .replace("REDIS_PASSWORD=change-me", f"REDIS_PASSWORD={redis}")
        .replace("FLOWER_BASIC_AUTH=ops:change-me", f"FLOWER_BASIC_AUTH=ops:{flower}")
        .replace(
            "DELIVERY_CONSOLE_AUTH=ops:change-me-please", f"DELIVERY_CONSOLE_AUTH=ops:{console}"
        )
        .replace("DELIVERY_RECEIPTS_SECRET=whsec_change-me", f"DELIVERY_RECEIPTS_SECRET={receipts}")
    )


def main(target: Path) -> None:
    target.mkdir(mode=0o700, parents=True, exist_ok=False)
    # URL-safe and without characters a URL's userinfo would need escaped.
    postgres, redis, flower, console = (secrets.token_hex(24) for _ in range(4))
    receipts = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    for source in sorted(EXAMPLE.glob("*.env")):
        path = target / source.name
        path.touch(mode=0o600)
        path.write_text(fill(source.read_text(), postgres, redis, flower, console, receipts))
    print(f"wrote {target}; start with: DELIVERY_ENV_DIR={target} docker-compose up -d --build")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python deploy/make_env.py DIR (a folder that does not exist)")
    main(Path(sys.argv[1]))
