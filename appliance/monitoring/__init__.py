"""Monitoring that plugs in: the box's own gauges, and the Prometheus and Grafana files it ships.

``gauges`` registers scrape-time gauges (data dir disk space, budget use, the served certificate's
expiry) on :class:`appliance.metrics.Metrics`; ``export`` writes the shipped ``prometheus.yml``,
``alert_rules.yml`` and ``grafana-dashboard.json`` (package data in this folder) for one box.
May import settings, metrics, the database and the metering windows; nothing imports it but the
composition root, the daemon and the CLI.
"""
