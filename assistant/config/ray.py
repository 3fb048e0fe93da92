"""Engines as Ray Serve deployments (``[ray]``)."""

from __future__ import annotations

from dataclasses import dataclass

from assistant.config.fields import setting


@dataclass
class RayConfig:
    """Engines as Ray Serve deployments shared by many gateways (``tts.backend`` / ``asr.backend`` = ray)."""

    address: str = setting(
        "auto", "Ray cluster to join: auto (this node's cluster), host:port of its GCS, or ray://host:10001")
    namespace: str = setting("assistant", "Ray namespace of the Serve applications")
    app_name: str = setting("assistant", "prefix of the Serve applications: <app_name>-tts, -asr and -llm")
    deploy: bool = setting(
        True, "a gateway deploys an engine application that is not running yet (off: it only connects, and "
        "`assistant engines` or `serve deploy configs/serve.yaml` deploys)"
    )
    tts_replicas: int = setting(1, "TTS replicas (one per GPU for cosyvoice2)")
    tts_num_gpus: float = setting(0.0, "GPUs per TTS replica (1 for cosyvoice2 on CUDA)")
    tts_num_cpus: float = setting(1.0, "CPUs reserved per TTS replica")
    voices_per_replica: int = setting(4, "voices a TTS replica keeps warm (Serve model multiplexing by voice id)")
    asr_replicas: int = setting(1, "ASR replicas")
    asr_num_gpus: float = setting(0.0, "GPUs per ASR replica (a fraction such as 0.25 shares one GPU)")
    asr_num_cpus: float = setting(1.0, "CPUs reserved per ASR replica")
    llm_replicas: int = setting(1, "LLM replicas (respond.backend = ray): each loads the model once for its slots")
    llm_num_gpus: float = setting(0.0, "GPUs per LLM replica (with respond.gpu_layers and a CUDA build of llama.cpp)")
    llm_num_cpus: float = setting(1.0, "CPUs reserved per LLM replica")
    max_queued: int = setting(
        0, "requests each gateway may hold for a replica beyond a burst the size of the deployment (Serve counts a "
        "request as queued until a replica takes it, so the queue is replicas × (max_concurrent + max_waiting) + "
        "this); past it a request is refused busy"
    )
    connect_timeout_s: float = setting(60.0, "time to join the cluster and find (or deploy) the engine applications")
