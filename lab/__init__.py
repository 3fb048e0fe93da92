"""The team's lab: the studies that tune and defend the product, kept outside it.

The end-of-turn corpus, its evidence and tuner (``eot*``), the human set and what the ASR hears of it
(``human_set``, ``hearing``), the price of every language (``asr_languages``), the phone band (``narrowband``),
feature comparisons (``latency_features``), one process against Ray gateways (``ray_hop``), hostile clients
(``attacks``, ``attack_bench``), the engine child's isolation (``isolation``), what telemetry costs
(``telemetry_cost``), whether replies are worth hearing (``replies``), where the small model should say it is
not sure (``doubt``) and the offline GPU check (``gpu_check``).

Run from a checkout: ``python -m lab --help`` (``pip install -e '.[lab]'`` brings what the studies need). The lab
uses the product (``assistant``, its bench clients among it); ``assistant`` never imports the lab
(``tests/test_layering.py``).
"""
