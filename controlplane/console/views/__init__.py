"""Console views: one model layer, the API's querysets, FilterSets and serializers behind them.

One module per section of the console: ``capacity`` (pools, ledgers, profiles, selling),
``endpoints`` (list, form, detail and its live panel) and ``oncall`` (the event tail and the
attention panels). ``base`` is what every view shares: the signed-in principal on the request
(``console_view``), the partial/full rule (each page renders its full template, or only its
partial for htmx requests: ``is_partial``, ``page``) and the landing page. Live parts poll: the
endpoint detail every 5 s, the on-call tail every 2 s with a cursor.
"""
