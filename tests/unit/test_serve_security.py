"""Who may use Triton's administrative APIs when latte starts the server: the flags and the token."""

import argparse

import pytest

from latte.commands.serving import _access_token
from latte.triton.security import is_loopback, restricted_api_args
from latte.triton.server import TritonServer


def args(address="127.0.0.1", token=None, open_apis=False):
    return argparse.Namespace(address=address, access_token=token, open_admin_apis=open_apis)


def test_the_admin_apis_are_restricted_over_http_and_grpc_with_one_header():
    assert restricted_api_args("s3cret") == [
        "--http-restricted-api=shared-memory,model-repository,logging,trace:latte-admin-key=s3cret",
        "--grpc-restricted-protocol=shared-memory,model-repository,logging,trace:latte-admin-key=s3cret"]
    with pytest.raises(ValueError, match="without spaces, commas, colons"):
        restricted_api_args("a:b")


def test_off_loopback_a_token_is_made_up_unless_one_is_given_or_the_apis_are_left_open():
    assert _access_token(args()) is None                        # this machine only: nothing to guard
    made_up = _access_token(args("0.0.0.0"))
    assert made_up and made_up != _access_token(args("0.0.0.0"))  # random, each start its own
    assert _access_token(args("0.0.0.0", token="mine")) == "mine"
    assert _access_token(args("127.0.0.1", token="mine")) == "mine"  # asked for on loopback too
    assert _access_token(args("0.0.0.0", open_apis=True)) is None
    with pytest.raises(ValueError, match="--access-token and --open-admin-apis contradict"):
        _access_token(args("0.0.0.0", token="mine", open_apis=True))


def test_loopback_addresses():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")


def test_the_server_binds_where_it_is_told_and_carries_the_restriction(example_repo):
    server = TritonServer(example_repo, address="0.0.0.0", admin_token="tok")
    command = server.command()
    assert "--http-address=0.0.0.0" in command and "--grpc-address=0.0.0.0" in command
    assert restricted_api_args("tok")[0] in command and server.http_url.startswith("127.0.0.1:")
    assert server.admin_headers() == {"latte-admin-key": "tok"}
    plain = TritonServer(example_repo).command()
    assert "--http-address=127.0.0.1" in plain and not any("restricted" in flag for flag in plain)
