"""How keys and teams are named wherever they are shown: the key's name with its prefix."""

from appliance.accounts.labels import key_label, subject_label


def test_a_key_is_named_by_its_name_and_prefix():
    assert key_label("reporting-app", "ak_N5X07USWQ") == "reporting-app (ak_N5X07USWQ…)"


def test_a_key_without_a_name_or_gone_still_has_a_label():
    assert key_label("", "ak_N5X07USWQ") == "ak_N5X07USWQ…"
    assert key_label(None, None, 7) == "key:#7"


def test_subjects_name_keys_by_label_and_teams_by_name():
    assert subject_label("key", 3, key_name="billing", key_prefix="ak_abc", team_name=None) == "billing (ak_abc…)"
    assert subject_label("team", 4, key_name=None, key_prefix=None, team_name="research") == "team:research"
    assert subject_label("team", 4, key_name=None, key_prefix=None, team_name=None) == "team:#4"
