"""The report's service: a register/login service on FastAPI and SQLite.

The kind of service authd replaces, written the straightforward way, and kept only
as the benchmark's comparator (bench/seed-table.sh measures it with authbench
--protocol http in the same run as authd). Not for use.

- POST /register {"username", "password"}: 201, 409 when the name is taken, 422 when
  the body is malformed or a field breaks the rules below.
- POST /login {"username", "password"}: 200 with a signed token, 401 otherwise.
- GET /health: 200 when the database answers.

Passwords are PBKDF2-HMAC-SHA256 (hashlib) with a random 16-byte salt, stored as
`pbkdf2_sha256$ITERATIONS$SALT$HASH` (base64). Tokens are JWTs signed with
HMAC-SHA256. The endpoints are plain `def`s, so FastAPI runs each call on its
thread pool; every pool thread keeps one SQLite connection of its own, with SQLite's
defaults (rollback journal, synchronous=FULL).

Environment:
  REPORT_SERVICE_DATABASE    the SQLite file [report-service.db], created if missing
  REPORT_SERVICE_ITERATIONS  PBKDF2 rounds of new hashes [10000]
  REPORT_SERVICE_TOKEN_KEY   the token signing key [random at start, with a warning]
"""

import base64
import hashlib
import hmac
import json
import os
import secrets
import sqlite3
import sys
import threading
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

DATABASE = os.environ.get("REPORT_SERVICE_DATABASE", "report-service.db")
ITERATIONS = int(os.environ.get("REPORT_SERVICE_ITERATIONS", "10000"))
TOKEN_TTL_SECONDS = 3600

_key = os.environ.get("REPORT_SERVICE_TOKEN_KEY")
if _key:
    TOKEN_KEY = _key.encode()
else:
    print("report-service: REPORT_SERVICE_TOKEN_KEY is not set; signing with a random key",
          file=sys.stderr)
    TOKEN_KEY = secrets.token_bytes(32)

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    username TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    created_at INTEGER NOT NULL
)
"""

_local = threading.local()


def db() -> sqlite3.Connection:
    """This thread's connection (sqlite3 connections stay on the thread that made them)."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = sqlite3.connect(DATABASE, timeout=5.0)
        _local.conn = conn
    return conn


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, ITERATIONS)
    return "pbkdf2_sha256${}${}${}".format(
        ITERATIONS, base64.b64encode(salt).decode(), base64.b64encode(digest).decode()
    )


def verify_password(password: str, stored: str) -> bool:
    try:
        algorithm, iterations, salt, expected = stored.split("$")
    except ValueError:
        return False
    if algorithm != "pbkdf2_sha256":
        return False
    digest = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(salt), int(iterations)
    )
    return hmac.compare_digest(digest, base64.b64decode(expected))


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def issue_token(user_id: int, username: str) -> str:
    now = int(time.time())
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = b64url(json.dumps({
        "sub": str(user_id), "name": username, "iat": now, "exp": now + TOKEN_TTL_SECONDS,
    }).encode())
    signed = f"{header}.{claims}".encode()
    signature = hmac.new(TOKEN_KEY, signed, hashlib.sha256).digest()
    return f"{header}.{claims}.{b64url(signature)}"


class Credentials(BaseModel):
    username: str = Field(min_length=3, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    password: str = Field(min_length=8, max_length=1024)


@asynccontextmanager
async def lifespan(_app: FastAPI):
    with sqlite3.connect(DATABASE) as conn:
        conn.execute(SCHEMA)
    yield


app = FastAPI(title="report-service", lifespan=lifespan)


# The endpoints have no return annotation: FastAPI would take it as a response model
# and validate each answer on the thread pool, a second trip queued behind every
# request waiting for a thread, so that under load no answer would leave before the
# whole queue had been hashed.


@app.get("/health")
def health():
    db().execute("SELECT 1").fetchone()
    return {"status": "ok"}


@app.post("/register", status_code=201)
def register(body: Credentials):
    username = body.username.lower()
    conn = db()
    if conn.execute("SELECT 1 FROM users WHERE username = ?", (username,)).fetchone():
        raise HTTPException(status_code=409, detail="username taken")
    password_hash = hash_password(body.password)
    try:
        with conn:
            cursor = conn.execute(
                "INSERT INTO users (username, password_hash, created_at) VALUES (?, ?, ?)",
                (username, password_hash, int(time.time())),
            )
    except sqlite3.IntegrityError:
        # Registered by another request between the check and the insert.
        raise HTTPException(status_code=409, detail="username taken")
    return {"id": cursor.lastrowid, "username": username}


@app.post("/login")
def login(body: Credentials):
    username = body.username.lower()
    row = db().execute(
        "SELECT id, password_hash FROM users WHERE username = ?", (username,)
    ).fetchone()
    if row is None or not verify_password(body.password, row[1]):
        raise HTTPException(status_code=401, detail="invalid username or password")
    return {
        "access_token": issue_token(row[0], username),
        "token_type": "bearer",
        "expires_in": TOKEN_TTL_SECONDS,
    }
