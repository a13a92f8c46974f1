"""Snapshots → table rows, column by column, in the writer thread (off the engine's hot path)."""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from typing import Any

import pyarrow as pa

from vllm_contract import schema
from vllm_contract.plain import dumps, to_plain
from vllm_contract.recorder.columns import Column, FlatListColumn, IntColumn, RowTable
from vllm_contract.recorder.snapshot import NewRequest, Scheduled


# Token lists that carry the prompt: left out (NULL) when prompts are redacted.
REDACTED_FIELDS = ("prompt_token_ids", "prefill_token_ids", "all_token_ids")


def token_hash(ids) -> str:
    """Hex SHA-256 of token ids as little-endian int64: what the `redacted` table stores."""
    a = array("q", ids)
    if array("h", [1]).tobytes() != b"\x01\x00":  # big-endian host
        a.byteswap()
    return hashlib.sha256(a.tobytes()).hexdigest()


# Tables a step's schedule() output writes rows to (besides `steps`): undone together when a
# step fails part-way.
_SCHEDULE_TABLES = ("scheduled", "requests", "mm_inputs", "finished", "preempted", "freed_mm",
                    "extra_fields", "redacted")

# Tables a quarantined step's rows stay in: the engine's own events of it, and the quarantine.
_KEPT_WHOLE = ("finish_events", "malformed_steps")

# Tables kept as row tuples (RowTable), in exactly this column order; checked against the
# schema when Columns is built, so that a schema change cannot silently shift values.
ROW_TABLES = {
    "steps": ("step", "t_ns", "schedule_ns", "total_num_scheduled_tokens", "num_new",
              "num_cached", "num_finished", "num_running", "num_waiting", "kv_usage",
              "preempted_is_null", "invalid_spec_is_null", "cached_new_token_ids_len",
              "num_common_prefix_blocks", "new_block_ids_to_zero",
              "has_structured_output_requests", "pending_structured_output_tokens",
              "has_sync_kv_loads", "num_spec_tokens_to_schedule"),
    "updates": ("step", "t_ns", "update_ns", "num_outputs"),
    "transport": ("step", "event", "worker", "seq", "t_ns", "num_scheduled_tokens"),
}


def _others_json(others: dict) -> str | None:
    """The Request's other constructor arguments that are set (None, False and empty left
    out: the constructor's defaults), as plain-data JSON."""
    set_ = {k: v for k, v in (others or {}).items()
            if not (v is None or v is False or (isinstance(v, (list, dict, tuple)) and not v))}
    return json.dumps(to_plain(set_), sort_keys=True, default=repr) if set_ else None


class Columns:
    """Column buffers for every table; drained into one record batch per table."""

    def __init__(self, redact_prompts: bool = False) -> None:
        self.redact = redact_prompts
        # Block hashes of redacted prompts are hashed again with this: drawn per recording,
        # never written, so that no hash in the trace can be matched against a guessed prompt.
        self._salt = os.urandom(16) if redact_prompts else b""
        self.row_tables = {}
        for t, names in ROW_TABLES.items():
            assert tuple(schema.schema(t).names) == names, f"rows.ROW_TABLES[{t!r}] is stale"
            self.row_tables[t] = RowTable(schema.schema(t))
        self.cols = {t: {f.name: IntColumn(f.type) if f.type == pa.int64() else Column(f.type)
                         for f in schema.schema(t)}
                     for t in schema.TABLE_NAMES if t not in ROW_TABLES}
        self.cols["model_outputs"]["sampled_token_ids"] = FlatListColumn(
            schema.schema("model_outputs").field("sampled_token_ids").type)
        self._steps = self.row_tables["steps"].rows
        self._updates = self.row_tables["updates"].rows
        self._transport = self.row_tables["transport"].rows
        self.steps = 0
        self.quarantined: set[int] = set()  # steps in malformed_steps: their update goes there too
        self.salvaged = 0  # steps taken out at a flush (their steps row had been counted)
        # Bound append of every column, per table: _add() runs for every new row.
        self._appends = {t: [(name, col.append) for name, col in cols.items()]
                         for t, cols in self.cols.items()}

    def rows(self, table: str) -> int:
        if table in self.row_tables:
            return len(self.row_tables[table])
        return len(self.cols[table]["step"])

    def drain(self, pause=None) -> dict[str, pa.RecordBatch]:
        """One batch per table with rows (and always `steps`). `pause()` is called between
        columns: converting a column holds the GIL, and the writer lets the engine in. A step
        with a value Arrow cannot store is taken out of every table and quarantined whole."""
        try:
            try:
                out = self._batches(pause)
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                out = self._salvage()
        finally:
            for table in self.row_tables.values():
                table.clear()
            for cols in self.cols.values():
                for col in cols.values():
                    col.clear()
        self.steps = 0
        return out

    def _batches(self, pause) -> dict[str, pa.RecordBatch]:
        out = {}
        for table in schema.TABLE_NAMES:
            if not self.rows(table) and table != "steps":
                continue
            sch = schema.schema(table)
            if table in self.row_tables:
                arrays = self.row_tables[table].to_arrays(pause)
            else:
                cols = self.cols[table]
                arrays = []
                for f in sch:
                    arrays.append(cols[f.name].to_array())
                    if pause is not None:
                        pause()
            out[table] = pa.RecordBatch.from_arrays(arrays, schema=sch)
        return out

    def _pylists(self, table: str) -> dict[str, list]:
        names = schema.schema(table).names
        if table in self.row_tables:
            return dict(zip(names, self.row_tables[table].pylists()))
        return {name: self.cols[table][name].pylist() for name in names}

    def _salvage(self) -> dict[str, pa.RecordBatch]:
        """The slow way, taken only when a flush's conversion failed: find the rows Arrow
        cannot store, quarantine their steps (every table's rows of them), keep the rest."""
        data = {t: self._pylists(t) for t in schema.TABLE_NAMES}
        bad: dict[int, str] = {}
        bad_rows: dict[str, set[int]] = {t: set() for t in data}
        for table, cols in data.items():
            for f in schema.schema(table):
                try:
                    pa.array(cols[f.name], f.type)
                    continue
                except (pa.ArrowException, TypeError, ValueError, OverflowError):
                    pass
                for i, v in enumerate(cols[f.name]):
                    try:
                        pa.array([v], f.type)
                    except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
                        bad_rows[table].add(i)
                        bad.setdefault(cols["step"][i], f"{table}.{f.name}: {v!r} is not "
                                       f"{f.type} ({type(e).__name__}: {e})")
        for step, why in sorted(bad.items()):
            whole = {t: [dict(zip(c, row)) for row in zip(*c.values()) if row[0] == step]
                     for t, c in data.items()}
            t_ns = whole["steps"][0]["t_ns"] if whole["steps"] else None
            row = self._malformed_row(step, t_ns, "arrow", why,
                                      {t: r for t, r in whole.items() if r})
            for k, v in row.items():
                data["malformed_steps"][k].append(v)
            self.salvaged += bool(whole["steps"])
        self.quarantined.update(bad)
        out = {}
        for table, cols in data.items():
            if table in _KEPT_WHOLE:  # but for a row that is itself what Arrow refused
                keep = [i for i in range(len(cols["step"])) if i not in bad_rows[table]]
            else:
                keep = [i for i, st in enumerate(cols["step"]) if st not in bad]
            if len(keep) < len(cols["step"]):
                cols = {k: [v[i] for i in keep] for k, v in cols.items()}
            if cols["step"] or table == "steps":
                out[table] = pa.RecordBatch.from_pydict(cols, schema=schema.schema(table))
        return out

    def _add(self, table: str, **values: Any) -> None:
        get = values.get
        for name, append in self._appends[table]:
            append(get(name))

    def _extra(self, step: int, owner: str, req_id: str | None, extras) -> None:
        for name, tname, size, plain, blob in extras:
            self._add("extra_fields", step=step, owner=owner, req_id=req_id, field=name,
                      type_name=tname, size=size,
                      value_json=json.dumps(plain, sort_keys=True, separators=(",", ":")),
                      pickled=blob)

    def add_schedule(self, step: int, t_ns: int, dur_ns: int, state: tuple, s: Scheduled) -> bool:
        """The step's rows in every table, or (False) none of them and the step quarantined:
        one broken SchedulerOutput must not take the steps beside it down with it."""
        mark = [len(self._steps)] + [len(self.cols[t]["step"]) for t in _SCHEDULE_TABLES]
        try:
            self._add_schedule(step, t_ns, dur_ns, state, s)
            c = self.cols["scheduled"]
            n = len(c["step"])
            for name, col in c.items():
                if len(col) != n:
                    raise ValueError(f"scheduled.{name}: {len(col) - mark[1]} values for "
                                     f"{n - mark[1]} requests")
        except Exception as e:
            del self._steps[mark[0]:]
            for t, rows in zip(_SCHEDULE_TABLES, mark[1:]):
                for col in self.cols[t].values():
                    col.truncate(rows)
            self.quarantine(step, t_ns, "rows", f"{type(e).__name__}: {e}", s)
            return False
        self.steps += 1
        return True

    def quarantine(self, step: int, t_ns: int | None, stage: str, error: str, value: Any) -> None:
        """Keep a step (or the update of one) that the other tables cannot take, whole."""
        if stage != "update":
            self.quarantined.add(step)
        self._add("malformed_steps", **self._malformed_row(step, t_ns, stage, error, value))

    @staticmethod
    def _malformed_row(step: int, t_ns: int | None, stage: str, error: str, value: Any) -> dict:
        if isinstance(value, Scheduled):
            value = value._asdict()
        try:
            text = json.dumps(to_plain(value), sort_keys=True, separators=(",", ":"),
                              default=repr)
        except Exception as e:  # a value even plain() cannot take: what can be said of it
            text = json.dumps({"__unencodable__": f"{type(e).__name__}: {e}"})
        return {"step": step, "t_ns": t_ns, "stage": stage, "plain_json": text,
                "error": " ".join(str(error).split())}

    def _add_schedule(self, step: int, t_ns: int, dur_ns: int, state: tuple,
                      s: Scheduled) -> None:
        running, waiting, kv_usage = state
        self._steps.append((
            step, t_ns, dur_ns, s.total, len(s.new), len(s.req_ids), len(s.finished), running,
            waiting, kv_usage, s.preempted is None, s.invalid is None, len(s.new_token_ids),
            s.prefix_blocks, s.zero_blocks, s.structured, s.pending_structured, s.sync_kv_loads,
            s.spec_to_schedule))
        all_tokens = s.all_token_ids
        if all_tokens and self.redact:
            all_tokens = {rid: self._tokens(step, rid, "all_token_ids", ids)
                          for rid, ids in all_tokens.items()}
        new_ids = self._new_requests(step, s, all_tokens)
        in_order = self._cached_requests(step, s, all_tokens)
        self._named_only(step, s, all_tokens, new_ids, in_order)
        for rid in s.finished:
            self._add("finished", step=step, req_id=rid)
        for rid in s.preempted or ():
            self._add("preempted", step=step, req_id=rid)
        for pos, h in enumerate(s.freed_mm):
            self._add("freed_mm", step=step, pos=pos, mm_hash=h)
        self._extra(step, "SchedulerOutput", None, s.extra)
        self._extra(step, "CachedRequestData", None, s.cached_extra)

    def _new_requests(self, step: int, s: Scheduled, all_tokens: dict) -> list[str]:
        scheduled_tokens, spec, encoder, invalid = (s.num_scheduled_tokens, s.spec, s.encoder,
                                                    s.invalid or {})
        new_ids = []
        for pos, new in enumerate(s.new):
            req = new["req"]
            rid = req.req_id
            new_ids.append(rid)
            self._add("scheduled", step=step, req_id=rid, kind="new", pos=pos,
                      resumed=False, num_scheduled_tokens=scheduled_tokens.get(rid),
                      num_computed_tokens=req.num_computed_tokens,
                      new_block_ids=new["block_ids"], spec_token_ids=spec.get(rid),
                      num_invalid_spec_tokens=invalid.get(rid),
                      encoder_inputs=encoder.get(rid), all_token_ids=all_tokens.get(rid))
            self._request(step, pos, req, new)
        return new_ids

    def _cached_requests(self, step: int, s: Scheduled, all_tokens: dict) -> bool:
        """CachedRequestData's rows. They arrive column-wise already: whole columns, and runs for
        the columns that are constant in a decode step (see columns.py). True when
        num_scheduled_tokens lists the cached ids first, in order (what vLLM does)."""
        cols = self.cols["scheduled"]
        req_ids, resumed = s.req_ids, s.resumed
        n = len(req_ids)
        cols["step"].repeat(step, n)
        cols["req_id"].extend(req_ids)
        if resumed:
            is_resumed = [rid in resumed for rid in req_ids]
            cols["kind"].extend(["resumed" if f else "cached" for f in is_resumed])
            cols["resumed"].extend(is_resumed)
        else:
            cols["kind"].repeat("cached", n)
            cols["resumed"].repeat(False, n)
        cols["pos"].extend_range(n)
        # vLLM fills num_scheduled_tokens with the cached requests first, in req_ids order, then
        # the new ones: the column is then one slice of its values, and no id goes unnamed.
        scheduled_tokens = s.num_scheduled_tokens
        in_order = list(scheduled_tokens)[:n] == list(req_ids)
        cols["num_scheduled_tokens"].extend(
            list(scheduled_tokens.values())[:n] if in_order
            else list(map(scheduled_tokens.get, req_ids)))
        cols["num_computed_tokens"].extend(s.num_computed_tokens)
        cols["num_output_tokens"].extend(s.num_output_tokens)
        count, where, blocks = s.new_block_ids  # sparse, see snapshot.py
        col = cols["new_block_ids"]
        if any(blocks):
            prev = 0
            for i, b in zip(where, blocks):
                col.repeat(None, i - prev)
                col.append(b)
                prev = i + 1
            col.repeat(None, count - prev)
        else:  # as NULLs, like a step without new blocks (also when every entry is empty)
            col.repeat(None, n)
        new_tokens = s.new_token_ids
        if new_tokens:
            cols["new_token_ids"].extend(new_tokens[:n] + [None] * (n - len(new_tokens[:n])))
        else:
            cols["new_token_ids"].repeat(None, n)
        for name, by_id in (("all_token_ids", all_tokens), ("spec_token_ids", s.spec),
                            ("num_invalid_spec_tokens", s.invalid),
                            ("encoder_inputs", s.encoder)):
            if by_id:
                cols[name].extend(list(map(by_id.get, req_ids)))
            else:
                cols[name].repeat(None, n)
        if len(new_tokens) > n:  # only a broken scheduler sends more token lists than requests
            self._extra(step, "CachedRequestData", None,
                        [("new_token_ids", "builtins.list", 0, new_tokens, None)])
        return in_order

    def _named_only(self, step: int, s: Scheduled, all_tokens: dict, new_ids: list[str],
                    in_order: bool) -> None:
        """Ids named only by a per-request dict or set: exactly what a broken scheduler
        produces."""
        scheduled_tokens, spec, encoder, invalid, resumed = (
            s.num_scheduled_tokens, s.spec, s.encoder, s.invalid or {}, s.resumed)
        n = len(s.req_ids)
        if (in_order and list(scheduled_tokens)[n:] == new_ids
                and not (spec or encoder or invalid or all_tokens or resumed)):
            return  # its keys are exactly the ids named (dict keys are unique)
        named = set(new_ids).union(s.req_ids)
        for rid in sorted(set(scheduled_tokens).union(spec, encoder, invalid, all_tokens,
                                                      resumed) - named):
            self._add("scheduled", step=step, req_id=rid, kind=None, pos=None,
                      resumed=rid in resumed, num_scheduled_tokens=scheduled_tokens.get(rid),
                      spec_token_ids=spec.get(rid), encoder_inputs=encoder.get(rid),
                      num_invalid_spec_tokens=invalid.get(rid),
                      all_token_ids=all_tokens.get(rid))

    def _tokens(self, step: int, req_id: str, field: str, ids):
        """ids, or with redaction None and a `redacted` row (length and hash)."""
        if not self.redact or ids is None:
            return ids
        self._add("redacted", step=step, req_id=req_id, field=field, length=len(ids),
                  sha256=token_hash(ids))
        return None

    def _request(self, step: int, pos: int, r: Any, new: NewRequest) -> None:
        embeds = getattr(r, "prompt_embeds", None)
        prompt = r.prompt_token_ids
        self._add("requests", step=step, req_id=r.req_id, pos=pos,
                  prompt_token_ids=self._tokens(step, r.req_id, "prompt_token_ids", prompt),
                  prompt_len=len(prompt) if prompt is not None else (
                      int(embeds.shape[0]) if embeds is not None else 0),
                  sampling_params=dumps(r.sampling_params),
                  pooling_params=dumps(getattr(r, "pooling_params", None)),
                  lora_request=dumps(getattr(r, "lora_request", None)),
                  mm_features=dumps(getattr(r, "mm_features", None) or None),
                  prompt_embeds=dumps(embeds),
                  prompt_is_token_ids=getattr(r, "prompt_is_token_ids", None),
                  prefill_token_ids=self._tokens(step, r.req_id, "prefill_token_ids",
                                                 getattr(r, "prefill_token_ids", None)),
                  replay_start=getattr(r, "replay_start", None))
        for pos, f in enumerate(getattr(r, "mm_features", None) or ()):
            where = getattr(f, "mm_position", None)
            self._add("mm_inputs", step=step, req_id=r.req_id, pos=pos,
                      identifier=getattr(f, "identifier", None), mm_hash=getattr(f, "mm_hash", None),
                      modality=getattr(f, "modality", None), offset=getattr(where, "offset", None),
                      length=getattr(where, "length", None))
        self._extra(step, "NewRequestData", r.req_id, new["extra"])

    def add_update(self, step: int, t_ns: int, dur_ns: int, m: dict, finishes: list,
                   transport: list = ()) -> None:
        if step in self.quarantined:  # the finish events are the engine's: they stay
            self.quarantine(step, t_ns, "update", "the model output of a quarantined step",
                            {"model_output": m, "transport": transport})
            self.add_finishes(step, t_ns, "update_from_output", finishes)
            return
        req_ids = m["req_ids"]
        self._updates.append((step, t_ns, dur_ns, len(req_ids)))
        if transport:
            self._transport.extend((step, *row) for row in transport)
        c = self.cols["model_outputs"]
        n = len(req_ids)
        c["step"].repeat(step, n)
        c["req_id"].extend(req_ids)
        c["pos"].extend_range(n)
        values, lengths = m["sampled"]
        if len(lengths) == n:
            c["sampled_token_ids"].extend_flat(values, lengths)
        else:  # a broken model output: row by row, keeping what is there
            it = iter(values)
            for row in [[next(it) for _ in range(k)] for k in lengths][:n]:
                c["sampled_token_ids"].append(row)
            for _ in range(n - len(lengths)):
                c["sampled_token_ids"].append(None)
        nans = m["nans"]
        if nans:
            c["num_nans_in_logits"].extend(list(map(nans.get, req_ids)))
        else:
            c["num_nans_in_logits"].repeat(None, n)
        self._extra(step, "ModelRunnerOutput", None, m["extra"])
        index = m.get("index")
        # update_from_output() finds each request's tokens through this map, not req_ids' order:
        # kept (as extra_fields) only when it is not req_ids enumerated
        if index is not None and dict(zip(req_ids, range(n))) != index:
            self._extra(step, "ModelRunnerOutput", None,
                        [("req_id_to_index", type(index).__name__, 0, to_plain(index), None)])
        self.add_finishes(step, t_ns, "update_from_output", finishes)

    def add_finishes(self, step: int, t_ns: int, source: str, finishes: list) -> None:
        for rid, reason in finishes:
            self._add("finish_events", step=step, req_id=rid, reason=reason, source=source,
                      t_ns=t_ns)


    def add_transport(self, step: int, rows: list) -> None:
        self._transport.extend((step, *row) for row in rows)

    def add_input(self, item: Any) -> None:
        """A records.Input: its `inputs` rows, and for add_request() its `added` row."""
        step, seq, updates, t_ns, call, payload = item
        row = {"step": step, "seq": seq, "updates": updates, "t_ns": t_ns, "call": call}
        if call == "add_request":
            self._add("inputs", req_id=payload[0], **row)
            self._added(step, seq, payload)
        elif call == "finish_requests":
            given, status, finished = payload
            if given is None:  # finish_requests(None): every request the scheduler held
                self._add("inputs", status=status, **row)
            done = set(finished)
            order = list(finished) + [r for r in dict.fromkeys(given or ()) if r not in done]
            for pos, rid in enumerate(order):
                self._add("inputs", req_id=rid, pos=pos, status=status, finished=rid in done,
                          **row)
        elif call == "schedule":
            args, kwargs = payload
            self._add("inputs", args_json=json.dumps(to_plain({"args": list(args),
                                                               "kwargs": dict(kwargs)}),
                                                     sort_keys=True, default=repr), **row)
        else:  # the draft updates; into a step's output: which step's
            req_ids, drafts, into = payload
            where = None if into is None else json.dumps({"scheduler_output_step": into})
            for pos, (rid, toks) in enumerate(zip(req_ids, drafts)):
                self._add("inputs", req_id=rid, pos=pos, token_ids=toks, args_json=where,
                          **row)
            if not req_ids:  # a call with no request: it still happened
                self._add("inputs", args_json=where, **row)

    def _added(self, step: int, seq: int, p: tuple) -> None:
        (rid, arrival, priority, client, prompt, salt, sampling, pooling, lora, mm, n_prompt,
         hashes, others) = p
        if self.redact:
            prompt, salt = None, None
            hashes = [hashlib.blake2b(bytes(h), digest_size=16, key=self._salt).digest()
                      for h in hashes or ()]
        else:
            hashes = None
        self._add("added", step=step, seq=seq, req_id=rid, arrival_time=arrival,
                  priority=priority, client_index=client, num_prompt_tokens=n_prompt,
                  prompt_token_ids=None if prompt is None else list(prompt),
                  prompt_block_hashes=hashes, cache_salt=salt, sampling_params=dumps(sampling),
                  pooling_params=dumps(pooling), lora_request=dumps(lora),
                  mm_features=dumps(mm or None),
                  other_json=_others_json(others))
