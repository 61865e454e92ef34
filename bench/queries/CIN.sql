-- CIN: classify, keeping rows whose label is in an accepted list.
SELECT id FROM reviews
WHERE AI_CLASSIFY(body, ['food', 'service', 'price', 'ambience', 'booking']):labels[0]::string IN ('service', 'booking')
