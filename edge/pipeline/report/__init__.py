"""The pipeline's reports: ``report.json`` (everything), ``report.md`` (the table) and a self-contained
``report.html`` (inline CSS; the accuracy-vs-latency chart and the analysis heatmaps as PNG data URIs).

One job a module, each importing only the ones below it (``.importlinter``):

    write        the reports' one writer: ``edge pipeline`` writes them, ``edge deploy --report`` hands it
                 the fetched device results, rendered after the pipeline's own sections (edge.pipeline.device_report)
    markdown     report.md
    html_page    report.html
    chart        the accuracy-vs-speed chart (a PNG)
    story        the sections before and after the variants table (what was asked, chosen; precision, Orin, bundle)
    conditions   how it was measured: the accuracy and latency conditions, the ranking by speedup
    tables       the variants table and its cells
    model        report.json: every figure, built from a run's step records
"""
