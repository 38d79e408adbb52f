"""Fault-point arming syntax."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import faults


def test_parse_first_and_nth_hit():
    assert faults._parse("a.b=kill, c.d=kill@3") == {"a.b": 1, "c.d": 3}


def test_unknown_action_is_refused():
    with pytest.raises(ValueError, match="unknown action"):
        faults._parse("a=explode")


def test_an_armed_point_kills_the_process_at_its_nth_hit():
    code = "import faults\nfor i in range(5):\n    print(i, flush=True)\n    faults.point('p')\n"
    env = {**os.environ, "AGENTRUN_FAULTS": "p=kill@3"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == -9
    assert out.stdout.split() == ["0", "1", "2"]


def test_unarmed_points_are_inert():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_FAULTS")}
    code = "import faults\nfor _ in range(100):\n    faults.point('p')\nprint('ok')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert (out.returncode, out.stdout.strip()) == (0, "ok")


def test_parse_raise_actions():
    assert faults._parse_actions("a=raise, b=raise@2, c") == {
        "a": ("raise", 1),
        "b": ("raise", 2),
        "c": ("kill", 1),
    }


def test_a_point_armed_to_raise_raises_at_every_hit_from_the_nth():
    code = (
        "import faults\n"
        "for i in range(4):\n"
        "    try:\n"
        "        faults.point('p')\n"
        "        print(i, 'ok', flush=True)\n"
        "    except faults.InjectedFault:\n"
        "        print(i, 'raised', flush=True)\n"
    )
    env = {**os.environ, "AGENTRUN_FAULTS": "p=raise@2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["0 ok", "1 raised", "2 raised", "3 raised"]


def test_a_raises_point_raises_when_armed_to_and_random_faults_never_kill_there():
    code = (
        "import faults\n"
        "for i in range(3):\n"
        "    try:\n"
        "        faults.raises('p')\n"
        "        faults.raises('q')\n"
        "        print(i, 'ok', flush=True)\n"
        "    except faults.InjectedFault as exc:\n"
        "        print(i, exc, flush=True)\n"
    )
    env = {**os.environ, "AGENTRUN_FAULTS": "p=raise@2,q=kill", "AGENTRUN_FAULTS_RANDOM": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["0 ok", "1 fault point p", "2 fault point p"]


def test_within_a_prefix_only_its_points_count_and_fire_and_others_wait_their_turn():
    # The executor drives canary runs within "executor.canary.": a customer point armed
    # for its 2nd hit is neither hit nor fired by a canary, even with random faults on.
    code = (
        "import faults\n"
        "with faults.within('executor.canary.'):\n"
        "    for _ in range(3):\n"
        "        faults.point('executor.tool.x')\n"
        "    try:\n"
        "        faults.point('executor.canary.y')\n"
        "    except faults.InjectedFault as exc:\n"
        "        print(exc, flush=True)\n"
        "faults.point('executor.tool.x')\n"
        "print('first customer hit passed', flush=True)\n"
        "faults.point('executor.tool.x')\n"
    )
    env = {
        **os.environ,
        "AGENTRUN_FAULTS": "executor.tool.x=kill@2,executor.canary.y=raise",
        "AGENTRUN_FAULTS_RANDOM": "0",
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == -9, out.stderr
    assert out.stdout.splitlines() == ["fault point executor.canary.y", "first customer hit passed"]
