"""A prepared folder's dataset.json, as every reader checks it: a missing or unprepared folder
is an error naming the command that prepares the kind the reader wanted."""

import pytest

from hvd_bert.data.records import DatasetError
from hvd_bert.data.sidecar import read_sidecar


@pytest.mark.parametrize("kind,command", [("bert-classification", "prepare-classification"),
                                          ("bert-pretraining", "prepare-bert"), ("ncf", "prepare-ncf"),
                                          (("bert-classification", "bert-squad"), "prepare-squad")])
def test_a_missing_folder_names_the_command_for_its_kind(tmp_path, kind, command):
    with pytest.raises(DatasetError, match=rf"{tmp_path / 'nope'} does not exist; prepare it first \(.*"
                                           rf"hvd-bert {command}"):
        read_sidecar(tmp_path / "nope", kind)
    with pytest.raises(DatasetError, match=rf"has no dataset.json.*hvd-bert {command}"):
        read_sidecar(tmp_path, kind)
