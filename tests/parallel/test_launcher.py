"""``python -m hvd_bert.cluster.horovodrun``, the Gloo launch of ``hvd_bert.cluster.launch``: Horovod's own
launcher with its build check answered from a cached file instead of a TensorFlow import. Its
answers must be Horovod's own (``horovod.common.util``), computed once per install, and a
PyTorch job launched through it must not start TensorFlow anywhere (launcher included)."""

import json
import os
import subprocess
import sys

from hvd_bert.cluster import launch

TF_NOISE = ("oneDNN custom operations", "Could not find cuda drivers", "absl::InitializeLog")


def answers(code, cache):
    res = subprocess.run([sys.executable, "-c", f"import json; {code}"], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, HVD_BERT_CACHE=str(cache)))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


OURS = "from hvd_bert.cluster.horovodrun import built; print(json.dumps(built()))"
HOROVODS = ("from horovod.common.util import gloo_built, mpi_built; "
            "print(json.dumps({'gloo_built': gloo_built(), 'mpi_built': mpi_built()}))")


def test_the_cached_build_check_is_horovods_own_answer(tmp_path):
    cache = tmp_path / "cache"
    ours = answers(OURS, cache)
    assert ours == answers(HOROVODS, cache) == {"gloo_built": True, "mpi_built": True}
    files = list((cache / "horovod").glob("built-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text()) == ours
    files[0].write_text("{not json")  # a damaged cache file is asked again and rewritten
    assert answers(OURS, cache) == ours and json.loads(files[0].read_text()) == ours


def test_a_pytorch_gloo_launch_starts_no_tensorflow(tmp_path):
    res = launch.run(["-c", "import horovod.torch as hvd; hvd.init(); print('rank', hvd.rank())"], np=2,
                     timeout=120)
    assert res.ok, res.explain()
    assert "rank 0" in res.stdout and "rank 1" in res.stdout
    out = res.stdout + res.stderr
    assert not any(n in out for n in TF_NOISE), out[-3000:]
    assert "hvd_bert.cluster.horovodrun" in " ".join(res.command)
