"""The identity a resumable run records (`spec_decode.infer.chunks.ChunkStore`) is the same in
every process for the same settings: a bound function (T5X's logit_callback_fn) is recorded by
its module and name, never by a repr holding its memory address."""

from spec_decode.infer import chunks


def ban_token(logits, state):
  del state
  return logits


def test_a_function_in_the_settings_is_recorded_by_name(tmp_path):
  identity = {"decode_settings": {"logit_callback_fn": ban_token, "gamma": 3}}
  store = chunks.ChunkStore.open(str(tmp_path), identity)
  assert store.identity["decode_settings"] == {
      "logit_callback_fn": f"{__name__}.ban_token", "gamma": 3}

